// Mutual challenge-response authentication run on every new connection before it carries data.
//
// Both ends prove they hold the job secret without sending it, and each proof is bound to both fresh
// nonces, both ranks, the job size and the rail, so a recorded exchange cannot be replayed on
// another connection, rank pair or rail.
//
//   connector -> acceptor  kHello        {version, from rank, to rank, job size, rail, nonce_c}
//   acceptor  -> connector kChallenge    {nonce_a, HMAC(secret, "acceptor"  || transcript)}
//   connector -> acceptor  kAuthResponse {HMAC(secret, "connector" || transcript)}
//   acceptor  -> connector kAuthResult   {1 = accepted, 0 = rejected}
//
// transcript = nonce_c || nonce_a || from rank || to rank || size || rail (little endian). A
// connector that cannot verify the challenge answers kAuthResult{0} instead of kAuthResponse, so
// the acceptor can log which side gave up. HMAC-SHA256 (OpenSSL), CRYPTO_memcmp, RAND_bytes.
//
// The classes below are the protocol only ("sans I/O"): they consume and produce frame payloads, so
// every transport drives them with its own I/O, deadlines and concurrency.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"

namespace nezha::transport {

// The handshake's four messages. Every frame format that carries them numbers them with these
// values (frame.h's FrameType, agg/agg_protocol.h's AggType take theirs from here), so a frame's
// type byte converts to a HandshakeMessage as is.
enum class HandshakeMessage : uint8_t {
  kHello = 1,
  kChallenge = 2,
  kAuthResponse = 3,
  kAuthResult = 4,
};
const char* handshake_message_name(HandshakeMessage message);  // "hello", ...; "non-handshake"

// The peer failed to authenticate, or sent a malformed handshake message.
class AuthenticationError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

constexpr uint32_t kAuthProtocolVersion = 1;
constexpr size_t kAuthNonceBytes = 32;
constexpr size_t kAuthMacBytes = 32;
// Largest handshake payload either side accepts (a hello is the biggest).
constexpr uint64_t kMaxHandshakePayloadBytes = 64;

struct HandshakeParams {
  std::string secret;  // may be empty: the protocol still runs, with an empty key
  int rank = 0;        // this side's rank
  int size = 0;        // ranks in the job
  int rail_index = 0;  // -1 for the control channel
};

// The side that dials. Call hello(), send it; on the kChallenge payload call on_challenge() and send
// the returned kAuthResponse; on the kAuthResult payload call on_result().
class ConnectorHandshake {
 public:
  ConnectorHandshake(HandshakeParams params, int peer_rank);

  std::string hello();
  // Throws AuthenticationError if the acceptor does not know the secret (send
  // rejection_payload() to it, best effort, before closing).
  std::string on_challenge(const std::string& payload);
  // Throws AuthenticationError if the acceptor rejected us.
  void on_result(const std::string& payload);

  int peer_rank() const { return peer_rank_; }

 private:
  HandshakeParams params_;
  int peer_rank_;
  std::string nonce_c_;
  std::string nonce_a_;
};

// The side that accepted. On the kHello payload call on_hello() and send the returned kChallenge;
// on the next frame call on_response() and send result_payload(accepted).
class AcceptorHandshake {
 public:
  explicit AcceptorHandshake(HandshakeParams params);

  // Throws AuthenticationError for a malformed hello or one meant for another rank, rail or job size.
  std::string on_hello(const std::string& payload);
  // `type` is kAuthResponse (verified) or kAuthResult (the connector rejected our challenge).
  // Returns normally only if the connector proved it holds the secret; else AuthenticationError.
  void on_response(HandshakeMessage type, const std::string& payload);

  // Valid after on_hello(): the rank the connector claims (proven only once on_response() passed).
  int peer_rank() const { return peer_rank_; }

 private:
  HandshakeParams params_;
  int peer_rank_ = -1;
  std::string nonce_c_;
  std::string nonce_a_;
};

std::string auth_result_payload(bool accepted);

// HMAC-SHA256(key, message). Exposed for tests.
std::string hmac_sha256(const std::string& key, const std::string& message);

}  // namespace nezha::transport
