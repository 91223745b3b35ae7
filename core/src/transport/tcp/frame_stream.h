// Incremental frame I/O on a non-blocking stream socket. A FrameSender writes header + payload with
// one sendmsg() straight from the caller's buffer; a FrameReceiver reads the header, lets the caller
// check it and name the destination, then reads the payload straight there. Both make as much
// progress as the socket allows and return, so one poll() loop can drive several at once (sendrecv,
// a ring step, many half-finished handshakes) without ever blocking on one of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "common/deadline.h"
#include "transport/frame.h"

namespace nezha::transport::tcp {

// The socket failed: err is the errno, or 0 when the peer closed the connection (EOF). Internal to
// the TCP transport, which turns it into a PeerError naming rank and rail.
class SocketFailure : public std::runtime_error {
 public:
  explicit SocketFailure(int err);
  int err;
  std::string describe() const { return what(); }
};

class FrameSender {
 public:
  FrameSender(FrameType type, uint64_t tag, const void* payload, size_t bytes);

  // Writes what the socket takes now. Returns the payload bytes written by this call. Throws
  // SocketFailure.
  size_t progress(int fd);
  bool done() const { return sent_ == kFrameHeaderBytes + bytes_; }
  bool started() const { return sent_ > 0; }

 private:
  HeaderBytes header_;
  const uint8_t* payload_;
  size_t bytes_;
  size_t sent_ = 0;  // header and payload bytes written so far
};

class FrameReceiver {
 public:
  // Called once the header has arrived, with its raw bytes: parses and checks them (throwing
  // ProtocolError) and returns where the payload goes (nullptr is fine for length 0), setting
  // *length to the payload size.
  using HeaderHandler = std::function<uint8_t*(const uint8_t* header, uint64_t* length)>;

  // Reads what the socket has now, never past the end of this frame. Returns the payload bytes
  // read by this call. Throws SocketFailure, or whatever the handler throws.
  size_t progress(int fd, const HeaderHandler& on_header);
  bool done() const { return header_got_ == kFrameHeaderBytes && payload_got_ == length_; }
  bool started() const { return header_got_ > 0; }
  uint64_t payload_received() const { return payload_got_; }
  void reset();

 private:
  uint8_t header_[kFrameHeaderBytes] = {};
  size_t header_got_ = 0;
  uint8_t* payload_ = nullptr;
  uint64_t length_ = 0;
  uint64_t payload_got_ = 0;
};

// Blocking helpers for short exchanges (handshakes), bounded by the deadline and wake_fd (-1 for
// none). Throw SocketFailure on socket errors, with err = ETIMEDOUT when the deadline passes and
// ECANCELED when wake_fd becomes readable.
void write_frame(int fd, FrameType type, const std::string& payload, int wake_fd,
                 const Deadline& deadline);
// Reads one frame of at most max_length payload bytes; returns its header and fills *payload.
// Malformed headers throw ProtocolError.
FrameHeader read_frame(int fd, uint64_t max_length, std::string* payload, int wake_fd,
                       const Deadline& deadline);

}  // namespace nezha::transport::tcp
