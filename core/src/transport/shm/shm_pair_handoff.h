// Segment handoff for one pair of local ranks, on demand (the shm rail links a pair on its first
// data call: shm_rail.h).
//
// One exchange gives both ends each other's segment: the requester connects to the peer's abstract
// unix socket (its address names it) and sends {its rank, its nonce} with its own segment fd
// (SCM_RIGHTS); the peer's SegmentServer checks the request and answers with one byte and its
// segment fd. So a pair that talks costs one handoff (two when both ends ask at once), and a pair
// that never talks costs none.
//
// The server is a thread, not the rank's data calls: a peer must get our segment while our data
// thread is busy elsewhere, asleep on its doorbell or between calls, or the first transfer of a pair
// would wait for the other end to enter some data call. It hands its fd only to a client whose
// kernel-checked credentials (SO_PEERCRED) carry the pid, and whose request carries the nonce, of the
// rank it claims to be; a stranger is logged and dropped, and one that never finishes its request is
// dropped after kStrangerGraceMs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/deadline.h"

namespace nezha::transport::shm {

// Who may ask for our segment: a local peer's pid and raw 16-byte nonce (from its address).
struct PairPeerId {
  int32_t pid = 0;
  std::string nonce;
};

// Serves segment_fd on listener_fd (both stay owned by the caller and must outlive the server) to
// the peers in `peers`, until destroyed. For every genuine request it calls
// delivered(rank, fd) with the requester's own segment fd (the callee owns fd), then answers.
class SegmentServer {
 public:
  static constexpr int kStrangerGraceMs = 5000;
  using Delivered = std::function<void(int rank, int fd)>;

  SegmentServer(int listener_fd, int segment_fd, std::map<int, PairPeerId> peers, std::string where,
                Delivered delivered);
  ~SegmentServer();  // stops the thread and closes the connections it holds
  SegmentServer(const SegmentServer&) = delete;
  SegmentServer& operator=(const SegmentServer&) = delete;

  uint64_t served() const { return served_.load(); }  // genuine requests answered

 private:
  void run();
  // Answers one accepted connection; false if it is not complete yet (keep waiting for it).
  bool answer(int sock);

  const int listener_fd_;
  const int segment_fd_;
  const std::map<int, PairPeerId> peers_;
  const std::string where_;
  const Delivered delivered_;
  int stop_fd_ = -1;  // eventfd: the destructor's wake-up
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

// What a rank needs to ask one peer for its segment.
struct PairRequest {
  int my_rank = 0;
  std::string my_nonce;    // raw 16 bytes
  int my_segment_fd = -1;  // sent along: the peer maps it too
  int peer_rank = 0;
  int32_t peer_pid = 0;
  std::string peer_socket;  // abstract socket name, without the leading NUL
  std::string where;        // "rail X, rank R: <verb> rank P", for errors
};

// Fetches the peer's segment fd (the caller owns it). Waits in poll() on the socket, abort_fd (an
// eventfd that abort() makes readable) and peer_pidfd (-1: none), until the deadline:
//  * abort_reason() non-empty after abort_fd woke: NezhaError with that reason, naming the peer;
//  * the peer's process exited, its socket is gone or it hung up: PeerError naming it;
//  * the deadline passed (a frozen peer, or one whose rail is between reset() and connect()):
//    TimeoutError naming it.
int fetch_peer_segment(const PairRequest& request, int abort_fd, const std::function<std::string()>& abort_reason,
                       int peer_pidfd, const Deadline& deadline);

}  // namespace nezha::transport::shm
