#include "transport/auth.h"

#include <gtest/gtest.h>

namespace nezha::transport {
namespace {

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(Auth, HmacMatchesRfc4231TestCase2) {
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Auth, HmacWithEmptyKeyMatchesReference) {
  // Reference: python3 -c "import hmac,hashlib; print(hmac.new(b'', b'', hashlib.sha256).hexdigest())"
  EXPECT_EQ(to_hex(hmac_sha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

// Runs the whole exchange in memory. Returns "" on success, else the error.
std::string handshake(const std::string& connector_secret, const std::string& acceptor_secret,
                      int connector_rank = 2, int acceptor_rank = 1, int rail = 0) {
  ConnectorHandshake c(HandshakeParams{connector_secret, connector_rank, 4, rail}, acceptor_rank);
  AcceptorHandshake a(HandshakeParams{acceptor_secret, acceptor_rank, 4, 0});
  try {
    const std::string challenge = a.on_hello(c.hello());
    EXPECT_EQ(a.peer_rank(), connector_rank);
    std::string response;
    try {
      response = c.on_challenge(challenge);
    } catch (const AuthenticationError& e) {
      // The connector refuses; the acceptor must then refuse too when told so.
      EXPECT_THROW(a.on_response(HandshakeMessage::kAuthResult, auth_result_payload(false)), AuthenticationError);
      return std::string("connector: ") + e.what();
    }
    a.on_response(HandshakeMessage::kAuthResponse, response);
    c.on_result(auth_result_payload(true));
  } catch (const AuthenticationError& e) {
    return e.what();
  }
  return "";
}

TEST(Auth, SameSecretSucceeds) { EXPECT_EQ(handshake("s3cret", "s3cret"), ""); }

TEST(Auth, EmptySecretStillRunsTheProtocol) { EXPECT_EQ(handshake("", ""), ""); }

TEST(Auth, DifferentSecretFails) {
  const std::string what = handshake("s3cret", "other");
  EXPECT_NE(what.find("connector"), std::string::npos) << what;
  EXPECT_NE(what.find("secrets differ"), std::string::npos) << what;
  EXPECT_NE(handshake("", "x"), "");
}

TEST(Auth, AcceptorRejectsForgedResponse) {
  ConnectorHandshake c(HandshakeParams{"k", 1, 2, 0}, 0);
  AcceptorHandshake a(HandshakeParams{"k", 0, 2, 0});
  const std::string response = c.on_challenge(a.on_hello(c.hello()));
  std::string forged = response;
  forged[0] ^= 1;
  EXPECT_THROW(a.on_response(HandshakeMessage::kAuthResponse, forged), AuthenticationError);
  EXPECT_THROW(a.on_response(HandshakeMessage::kAuthResponse, std::string(kAuthMacBytes, '\0')),
               AuthenticationError);
}

TEST(Auth, ResponseCannotBeReplayedOnAnotherConnection) {
  // The proof covers both nonces, so a response recorded on one connection fails on the next.
  ConnectorHandshake c1(HandshakeParams{"k", 1, 2, 0}, 0);
  AcceptorHandshake a1(HandshakeParams{"k", 0, 2, 0});
  const std::string recorded = c1.on_challenge(a1.on_hello(c1.hello()));
  AcceptorHandshake a2(HandshakeParams{"k", 0, 2, 0});
  a2.on_hello(c1.hello());  // same hello replayed; the acceptor picks a fresh nonce
  EXPECT_THROW(a2.on_response(HandshakeMessage::kAuthResponse, recorded), AuthenticationError);
}

TEST(Auth, ConnectorRejectsResult0) {
  ConnectorHandshake c(HandshakeParams{"k", 1, 2, 0}, 0);
  EXPECT_THROW(c.on_result(auth_result_payload(false)), AuthenticationError);
}

TEST(Auth, HelloForAnotherRankRailOrJobIsRejected) {
  {  // meant for rank 3, arrives at rank 1
    ConnectorHandshake c(HandshakeParams{"k", 2, 4, 0}, 3);
    AcceptorHandshake a(HandshakeParams{"k", 1, 4, 0});
    EXPECT_THROW(a.on_hello(c.hello()), AuthenticationError);
  }
  {  // other rail
    ConnectorHandshake c(HandshakeParams{"k", 2, 4, 1}, 1);
    AcceptorHandshake a(HandshakeParams{"k", 1, 4, 0});
    EXPECT_THROW(a.on_hello(c.hello()), AuthenticationError);
  }
  {  // other job size
    ConnectorHandshake c(HandshakeParams{"k", 2, 8, 0}, 1);
    AcceptorHandshake a(HandshakeParams{"k", 1, 4, 0});
    EXPECT_THROW(a.on_hello(c.hello()), AuthenticationError);
  }
  {  // garbage
    AcceptorHandshake a(HandshakeParams{"k", 1, 4, 0});
    EXPECT_THROW(a.on_hello("hello?"), AuthenticationError);
  }
}

}  // namespace
}  // namespace nezha::transport
