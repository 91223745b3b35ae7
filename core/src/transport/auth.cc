#include "transport/auth.h"

#include "transport/frame.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace nezha::transport {
namespace {

constexpr size_t kHelloBytes = 4 + 4 * 4 + kAuthNonceBytes;

std::string random_nonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1)
    throw NezhaError("authentication: RAND_bytes failed to produce a nonce");
  return nonce;
}

void append_u32(std::string& out, uint32_t v) {
  uint8_t b[4];
  put_le(b, v, 4);
  out.append(reinterpret_cast<const char*>(b), 4);
}

uint32_t read_u32(const std::string& s, size_t offset) {
  return static_cast<uint32_t>(get_le(reinterpret_cast<const uint8_t*>(s.data()) + offset, 4));
}

// What both proofs are bound to; the label keeps the acceptor's proof from being reflected back as
// the connector's.
std::string proof(const std::string& secret, const char* label, const std::string& nonce_c,
                  const std::string& nonce_a, int from_rank, int to_rank, int size, int rail) {
  std::string msg(label);
  msg += nonce_c;
  msg += nonce_a;
  append_u32(msg, static_cast<uint32_t>(from_rank));
  append_u32(msg, static_cast<uint32_t>(to_rank));
  append_u32(msg, static_cast<uint32_t>(size));
  append_u32(msg, static_cast<uint32_t>(rail));
  return hmac_sha256(secret, msg);
}

bool equal_mac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  // HMAC() rejects a null key pointer on some builds even with length 0; point at a dummy byte.
  static const unsigned char kEmpty = 0;
  const void* key_ptr = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (HMAC(EVP_sha256(), key_ptr, static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out,
           &out_len) == nullptr)
    throw NezhaError("authentication: HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

std::string auth_result_payload(bool accepted) { return std::string(1, accepted ? '\1' : '\0'); }

ConnectorHandshake::ConnectorHandshake(HandshakeParams params, int peer_rank)
    : params_(std::move(params)), peer_rank_(peer_rank), nonce_c_(random_nonce()) {}

std::string ConnectorHandshake::hello() {
  std::string out;
  append_u32(out, kAuthProtocolVersion);
  append_u32(out, static_cast<uint32_t>(params_.rank));
  append_u32(out, static_cast<uint32_t>(peer_rank_));
  append_u32(out, static_cast<uint32_t>(params_.size));
  append_u32(out, static_cast<uint32_t>(params_.rail_index));
  out += nonce_c_;
  return out;
}

std::string ConnectorHandshake::on_challenge(const std::string& payload) {
  if (payload.size() != kAuthNonceBytes + kAuthMacBytes)
    throw AuthenticationError("malformed challenge (" + std::to_string(payload.size()) + " bytes)");
  nonce_a_ = payload.substr(0, kAuthNonceBytes);
  const std::string expected = proof(params_.secret, "acceptor", nonce_c_, nonce_a_, params_.rank,
                                     peer_rank_, params_.size, params_.rail_index);
  if (!equal_mac(expected, payload.substr(kAuthNonceBytes)))
    throw AuthenticationError("rank " + std::to_string(peer_rank_) +
                              " failed to prove it holds the job secret (the secrets differ)");
  return proof(params_.secret, "connector", nonce_c_, nonce_a_, params_.rank, peer_rank_,
               params_.size, params_.rail_index);
}

void ConnectorHandshake::on_result(const std::string& payload) {
  if (payload != auth_result_payload(true))
    throw AuthenticationError("rank " + std::to_string(peer_rank_) +
                              " rejected our authentication (the secrets differ)");
}

AcceptorHandshake::AcceptorHandshake(HandshakeParams params)
    : params_(std::move(params)), nonce_a_(random_nonce()) {}

std::string AcceptorHandshake::on_hello(const std::string& payload) {
  if (payload.size() != kHelloBytes)
    throw AuthenticationError("malformed hello (" + std::to_string(payload.size()) + " bytes)");
  const uint32_t version = read_u32(payload, 0);
  const int from = static_cast<int32_t>(read_u32(payload, 4));
  const int to = static_cast<int32_t>(read_u32(payload, 8));
  const int size = static_cast<int32_t>(read_u32(payload, 12));
  const int rail = static_cast<int32_t>(read_u32(payload, 16));
  if (version != kAuthProtocolVersion)
    throw AuthenticationError("hello speaks handshake version " + std::to_string(version) +
                              ", this build speaks " + std::to_string(kAuthProtocolVersion));
  if (size != params_.size)
    throw AuthenticationError("hello from a job of " + std::to_string(size) + " ranks, this job has " +
                              std::to_string(params_.size));
  if (from < 0 || from >= params_.size || from == params_.rank)
    throw AuthenticationError("hello claims invalid rank " + std::to_string(from));
  if (to != params_.rank)
    throw AuthenticationError("hello from rank " + std::to_string(from) + " is meant for rank " +
                              std::to_string(to) + ", this is rank " + std::to_string(params_.rank));
  if (rail != params_.rail_index)
    throw AuthenticationError("hello from rank " + std::to_string(from) + " is for rail index " +
                              std::to_string(rail) + ", this is rail index " +
                              std::to_string(params_.rail_index));
  peer_rank_ = from;
  nonce_c_ = payload.substr(20, kAuthNonceBytes);
  return nonce_a_ + proof(params_.secret, "acceptor", nonce_c_, nonce_a_, peer_rank_, params_.rank,
                          params_.size, params_.rail_index);
}

const char* handshake_message_name(HandshakeMessage message) {
  switch (message) {
    case HandshakeMessage::kHello: return "hello";
    case HandshakeMessage::kChallenge: return "challenge";
    case HandshakeMessage::kAuthResponse: return "auth-response";
    case HandshakeMessage::kAuthResult: return "auth-result";
  }
  return "non-handshake";
}

void AcceptorHandshake::on_response(HandshakeMessage type, const std::string& payload) {
  if (type == HandshakeMessage::kAuthResult)
    throw AuthenticationError("rank " + std::to_string(peer_rank_) +
                              " could not verify our challenge (the secrets differ)");
  if (type != HandshakeMessage::kAuthResponse || nonce_c_.empty())
    throw AuthenticationError(std::string("unexpected ") + handshake_message_name(type) +
                              " frame during the handshake");
  const std::string expected = proof(params_.secret, "connector", nonce_c_, nonce_a_, peer_rank_,
                                     params_.rank, params_.size, params_.rail_index);
  if (!equal_mac(expected, payload))
    throw AuthenticationError("peer claiming rank " + std::to_string(peer_rank_) +
                              " failed to prove it holds the job secret (the secrets differ)");
}

}  // namespace nezha::transport
