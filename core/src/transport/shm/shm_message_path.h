// ShmMessagePath: the engine's control messages between ranks of one host through shared memory. The
// control channel puts it before its TCP paths (engine/negotiation/control_channel.h), so negotiating
// an operation on one host costs no trip through the network stack: on a busy host a loopback TCP
// message costs the sender the whole receive path (softirq) and the receiver a wake-up, and rank 0
// of a star pays that for every rank on every operation.
//
// Layout. Each rank owns one segment (shm_segment.h: a sealed memfd, never named in /dev/shm) with one
// byte ring per rank of the job (slot = the sender's rank; pages of rings nobody uses are never
// touched) and one eventfd, its doorbell: the engine waits on descriptors (epoll), not on futexes. A
// message is its 8-byte length and its bytes, streamed through the ring, so a message of any size
// passes a ring of any size. Both are handed to each linked local peer at connect (shm_handoff.h,
// exchange_fds) under the shm rail's rules: same host, namespace and boot (shm_address.h), the
// peer's credentials and nonce checked, the segment's identity checked.
//
// Waking (shm_ring.h's protocol, an eventfd in the futex's place). append_poll_fds(), which the
// caller runs right before it waits, sets this rank's `sleeping` flag and re-checks the rings,
// ringing its own doorbell if something is there already; whoever publishes a message for a peer
// writes that peer's doorbell only if its flag is set; read_polled() clears it. A rank that knows
// it has nothing to do until several messages have come (rank 0 waiting for an operation's
// requests: wake_after_messages) arms with that count in its header's `wake_after`; each sender
// counts it down and only the last one rings, so rank 0 is woken once per operation, not once per
// request. Whoever frees space in a ring writes the producer's doorbell only if the producer is
// blocked on that ring (its ring's `producer_waiting`): in the usual lock-step of requests and
// responses both ends sleep waiting for messages, and a wake-up for freed space would be one per
// message for nothing. A rank that polls readable_now() before it sleeps (the engine's lead does,
// for a few tens of microseconds) takes messages that arrive meanwhile without a wake-up.
//
// Failures. Messages handed over are never lost (reliable()): a peer can only fail with its process,
// and each linked peer's pidfd is polled beside the doorbell, so a killed rank is reported at once,
// after the messages it sent before dying, as a closed TCP connection would be. close() and abort()
// mark this rank's segment closed and ring every peer. A sender blocked on a full ring takes in what
// its peers send meanwhile (two ranks sending each other large messages cannot both wait), checks the
// peer every liveness slice, and times out at its deadline naming the peer.
//
// The host board: rank 0's segment ends with config.host_board_bytes that the path does not use; every
// linked rank maps them with the segment (host_board()), for the engine's host votes.
//
// Threads: one thread makes the data calls (the engine loop); abort() from any thread.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "transport/message_path.h"
#include "transport/rail_factory.h"
#include "transport/shm/shm_address.h"
#include "transport/shm/shm_handoff.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm/shm_segment.h"

namespace nezha::transport {

struct ShmMessagePathConfig {
  std::string name = "control/shm";
  std::string secret;   // job secret: the segment's job tag, the handoff socket's name
  std::string host_id;  // launcher host entry (placement); may be empty
  size_t max_ring_bytes = 256 << 10;        // per sender; control messages are mostly small
  size_t segment_budget = size_t{8} << 20;  // all rings of one segment, where >= kMinRingBytes each
  double liveness_slice_ms = 50;            // a blocked sender checks its peer this often
  size_t host_board_bytes = 0;              // rank 0's segment's trailer (MessagePath::host_board)
};

class ShmMessagePath final : public MessagePath {
 public:
  static constexpr size_t kMinRingBytes = size_t{16} << 10;

  ShmMessagePath(ShmMessagePathConfig config, int rank, int size);
  ~ShmMessagePath() override;
  ShmMessagePath(const ShmMessagePath&) = delete;
  ShmMessagePath& operator=(const ShmMessagePath&) = delete;

  std::string local_address() const override;
  // Links the peers with a non-empty address on this host; the others are left to other paths
  // (reaches() false).
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void close() override;
  void abort(const std::string& reason) override;

  void send_message(int peer, const std::string& payload, const Deadline& deadline) override;
  std::optional<Message> recv_message_any(int wake_fd, const Deadline& deadline) override;
  void append_poll_fds(std::vector<struct pollfd>& fds) const override;
  void read_polled(const struct pollfd* fds, size_t n, std::vector<Message>& out) override;

  bool reaches(int peer) const override;
  bool reliable() const override { return true; }
  bool readable_now() const override;
  void wake_after_messages(int messages) override;
  HostBoard host_board() const override;

  size_t ring_bytes() const { return ring_bytes_; }

 private:
  struct Link {  // this rank's view of one linked peer
    bool linked = false;
    shm::Segment segment;  // the peer's (holds the ring this rank fills)
    shm::RingEnd out;      // producer end, in the peer's segment
    shm::RingEnd in;       // consumer end, in this rank's segment
    int doorbell = -1;     // the peer's eventfd
    int pidfd = -1;        // -1: same process (tests with threads) or no pidfd support
    int32_t pid = 0;
    uint64_t start_time = 0;
    std::string failed;    // non-empty once the peer is gone (reported once, then refused)
    // The message being received: its length (8 bytes, possibly split by the ring), then its bytes.
    uint8_t length[8] = {};
    size_t length_have = 0;
    uint64_t need = 0;
    std::string partial;
  };

  // Moves whatever the peers' rings hold into out (whole messages) and the partial buffers, and
  // wakes a sender waiting for the space freed.
  void read_rings(std::vector<Message>& out);
  void read_ring(int peer, Link& l, std::vector<Message>& out);
  // Throws PeerError for the first linked peer that closed its path or whose process exited
  // (exited[peer]: its pidfd fired), after taking in what it published before.
  void check_gone(const std::vector<char>& exited, std::vector<Message>& out);
  void wait_for_space(int peer, Link& l, const Deadline& deadline);
  [[noreturn]] void fail_link(int peer, const std::string& why);
  void ring(const Link& l) const;  // the peer's doorbell, if it may sleep
  // After a whole message for the peer: its doorbell, if it may sleep and this message is the
  // last it waits for (wake_after).
  void ring_for_message(const Link& l) const;
  void drain_doorbell() const;
  void arm() const;                // sets `sleeping`, rings this rank's own doorbell if not needed
  bool rings_hold_data() const;
  void throw_if_aborted() const;
  std::string where(const char* verb, int peer) const;
  void drop_links();

  ShmMessagePathConfig config_;
  const int rank_, size_;
  size_t ring_bytes_ = 0;
  shm::ShmAddress address_;
  std::string nonce_, job_tag_;  // raw 16 bytes each
  shm::HandoffListener listener_;
  shm::Segment own_;
  int doorbell_ = -1;  // this rank's eventfd
  std::vector<Link> links_;  // by rank
  // The linked ranks, in order: what every wait walks (a worker of the star links rank 0 only, and
  // walking every rank's Link would touch a cold cache line per rank on each wake-up).
  std::vector<int> linked_peers_;
  std::deque<Message> pending_;  // whole messages taken in while sending (recv_message_any, read_polled)
  int wake_after_ = 1;  // what arm() arms with (wake_after_messages)
  mutable bool armed_with_count_ = false;  // armed with wake_after_ > 1 since the last reset to 1
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // abort() vs connect/close changing the mappings; abort_reason_
  std::string abort_reason_;
};

std::unique_ptr<MessagePath> make_shm_message_path(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
