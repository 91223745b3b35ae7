// Exception types. Every error that reaches a user says what failed: the tensor, the rank(s), the
// rail. NezhaError is what Python sees (nezha.NezhaError); the subclasses let the engine decide what
// is recoverable:
//   InvalidArgument  - bad input from the caller; nothing was sent, the engine is untouched.
//   ProtocolError    - a peer sent a frame we did not expect (garbage, wrong tag/length); the
//                      connection it came on is closed.
//   PeerError        - a connection to a peer failed (reset, closed, unreachable) on one rail.
//   TimeoutError     - a deadline passed while waiting for a peer; names the peer and rail.
//   MismatchError    - ranks submitted the same tensor name with different metadata; only that
//                      operation fails, the engine stays usable.
#pragma once

#include <stdexcept>
#include <string>

namespace nezha {

class NezhaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public NezhaError {
 public:
  using NezhaError::NezhaError;
};

class ProtocolError : public NezhaError {
 public:
  using NezhaError::NezhaError;
};

class PeerError : public NezhaError {
 public:
  PeerError(int peer, const std::string& what) : NezhaError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

class TimeoutError : public PeerError {
 public:
  using PeerError::PeerError;
};

class MismatchError : public NezhaError {
 public:
  using NezhaError::NezhaError;
};

}  // namespace nezha
