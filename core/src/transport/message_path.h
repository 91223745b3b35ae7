// MessagePath: the small interface the engine's control channel (engine/negotiation/control_channel.h) needs
// from a transport: whole variable-length messages to and from any peer, and file descriptors to
// wait on beside the engine's own. TcpRail implements it (kControl frames); the control channel
// never names a concrete transport.
//
// Promises: a message is delivered whole, once, in order per (sender, receiver); a lost or
// duplicated one is a ProtocolError. send_message() returns once the message is handed over whole.
// Threads: one thread makes the data calls (the engine loop); abort() from any thread.
#pragma once

#include <optional>
#include <poll.h>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace nezha::transport {

class MessagePath {
 public:
  virtual ~MessagePath() = default;

  struct Message {
    int peer;
    std::string payload;
  };

  // Lifecycle, as Rail's (rail.h): opaque address bytes, a mesh from every rank's address. An empty
  // address leaves that peer out: no connection either way (both ranks must leave each other out;
  // a star through rank 0 costs n connections where the full mesh costs n^2 / 2).
  virtual std::string local_address() const = 0;
  virtual void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) = 0;
  virtual void close() = 0;
  virtual void abort(const std::string& reason) = 0;

  virtual void send_message(int peer, const std::string& payload, const Deadline& deadline) = 0;
  // Waits until one whole message has arrived from any peer (returns it), or wake_fd (may be -1)
  // becomes readable (std::nullopt, wake_fd not read), or the deadline passes (std::nullopt).
  virtual std::optional<Message> recv_message_any(int wake_fd, const Deadline& deadline) = 0;
  // For waiting on several paths at once: appends every fd whose readiness means progress (POLLIN);
  // when any is readable, recv_message_any(-1, an expired deadline) makes progress without blocking.
  virtual void append_poll_fds(std::vector<struct pollfd>& fds) const = 0;
  // After a poll() over what append_poll_fds appended (fds[0, n), revents filled in): reads what
  // the readable ones hold, without waiting or polling again, and appends every whole message to
  // out (with any read before, not yet returned). A failed peer: PeerError, after appending what
  // came before; an aborted path: NezhaError.
  virtual void read_polled(const struct pollfd* fds, size_t n, std::vector<Message>& out) = 0;
  // As Rail::link_fault(): non-empty when this rank's own link of the path is gone (no carrier).
  virtual std::string link_fault() const { return {}; }
  // After connect: whether messages to `peer` can go this way (a host-local path reaches only the
  // ranks of its host).
  virtual bool reaches(int peer) const { return peer >= 0; }
  // True if a message handed over is never lost while both ranks live (the peer's death is
  // reported by the path): an unacknowledged message then means a slow peer, not a cut.
  virtual bool reliable() const { return false; }
  // Without a system call: whether a message, or news of a failed peer, is waiting (for a caller
  // that polls briefly before it sleeps). False where the path cannot tell cheaply.
  virtual bool readable_now() const { return false; }
  // A hint for the waits until it is set back to 1: the caller has nothing to do until `messages`
  // messages have come (rank 0 waiting for the requests an operation still lacks). A path may then
  // sleep through fewer, never more: every message counts toward it, whoever sends it, and a
  // failed peer still ends the wait at once. Paths that wake for each message ignore it.
  virtual void wake_after_messages(int /*messages*/) {}

  // Memory every rank that shares this path with rank 0 maps (the shared-memory path: the trailer
  // of rank 0's segment, RailContext::host_board_bytes; engine/negotiation/host_vote_board.h).
  struct HostBoard {
    uint8_t* base = nullptr;  // nullptr: none
    size_t bytes = 0;
  };
  virtual HostBoard host_board() const { return {}; }
};

}  // namespace nezha::transport
