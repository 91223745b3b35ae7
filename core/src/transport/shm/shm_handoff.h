// Hands the ranks of one host each other's segment fds: every rank listens on an abstract unix
// socket (named in its address; abstract names live in the network namespace, so a testbed "host"
// cannot even reach another's), connects to every local peer, sends {its rank, its nonce} and gets
// the peer's memfd (with, for a control path, its doorbell eventfd) back over SCM_RIGHTS. A server
// hands its fds only to a client whose kernel-checked credentials (SO_PEERCRED) carry the pid, and
// whose request carries the nonce, of the rank it claims to be. No data ever goes through these
// sockets.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/shm/shm_address.h"

namespace nezha::transport::shm {

// Fills *out with the abstract unix socket address `name` (no leading NUL) and returns its length.
// Throws InvalidArgument if the name does not fit.
socklen_t abstract_address(const std::string& name, sockaddr_un* out);

// A listening abstract unix socket. Move-only.
class HandoffListener {
 public:
  HandoffListener() = default;
  explicit HandoffListener(const std::string& socket_name);
  HandoffListener(HandoffListener&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  HandoffListener& operator=(HandoffListener&& o) noexcept;
  ~HandoffListener() { close(); }
  int fd() const { return fd_; }
  void close();

 private:
  int fd_ = -1;
};

struct HandoffPeer {
  int rank;
  ShmAddress address;
  std::string nonce;  // raw 16 bytes (address.nonce_hex decoded)
};

// Serves segment_fd to each of `peers` and fetches each peer's segment fd (returned in the order
// of `peers`; the caller owns them). Throws NezhaError naming the ranks still missing when the
// deadline passes or *aborted becomes true (checked every few ms); PeerError when a peer's process
// is gone.
// Most fds one rank hands over (a segment and its doorbell, today).
constexpr size_t kMaxHandoffFds = 4;

std::vector<int> exchange_segment_fds(const HandoffListener& listener, int my_rank,
                                      const std::string& my_nonce, int segment_fd,
                                      const std::vector<HandoffPeer>& peers,
                                      const std::atomic<bool>& aborted, const Deadline& deadline,
                                      const std::string& rail_name);

// As exchange_segment_fds, for several fds per rank: serves served_fds (every peer gets them all, in
// that order) and returns each peer's, in the order of `peers`. Every peer serves as many fds as this
// rank does; a reply with another count is a ProtocolError.
std::vector<std::vector<int>> exchange_fds(const HandoffListener& listener, int my_rank, const std::string& my_nonce,
                                           const std::vector<int>& served_fds, const std::vector<HandoffPeer>& peers,
                                           const std::atomic<bool>& aborted, const Deadline& deadline,
                                           const std::string& rail_name);

}  // namespace nezha::transport::shm
