// Control messages from one peer, read in bulk. One recv() takes whatever the socket holds (often
// several small negotiation messages at once) and every whole frame in it becomes a message.
//
// Why: reading a header and then its payload costs two system calls per message, and a rank that
// coordinates a small allreduce receives one message per peer for each: on a busy host those
// calls are a good part of the operation. With this and ControlChannel reading what its own poll
// found (MessagePath::read_polled), rank 0 of 4 (2 cores, 8-byte allreduces inside jit) makes ~12
// system calls per operation instead of ~20 (reads 5.8 -> 2.9, polls 7.4 -> 2.9). A socket that
// carries only kControl frames (a control channel's path) can be read ahead like this; one
// carrying data frames cannot, as their payloads go straight to the caller's buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "transport/message_path.h"

namespace nezha::transport::tcp {

class ControlInbox {
 public:
  // Reads what fd holds now (non-blocking, one recv) and appends each whole message to out as
  // {peer, payload}, checking every header first (kControl, the next sequence number, at most
  // kMaxControlPayloadBytes: else ProtocolError naming peer and rail). Returns the bytes read.
  // Throws SocketFailure (EOF: err 0).
  size_t read(int fd, int peer, const std::string& rail, std::deque<MessagePath::Message>& out);
  // Drops a partly received message (the connection is gone); the sequence continues.
  void drop_partial();
  // As new: for a fresh connection.
  void reset();

 private:
  std::string buf_;   // bytes [0, used_) received and not yet a whole message
  size_t used_ = 0;
  uint64_t received_ = 0;  // whole messages so far: the next frame's expected tag
};

}  // namespace nezha::transport::tcp
