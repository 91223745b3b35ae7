// ShmRail: a point-to-point rail between the ranks of one host through shared memory (reach: this host only).
//
// Layout. Each rank owns one segment holding its inbound rings, one per local sender
// (shm_segment.h); a rank sends by copying into its ring in the receiver's segment and receives by
// copying out of the rings in its own. Receiver-owned segments give every rank one doorbell to
// sleep on for everything it may wait for (data in, or space freed in a ring it fills), so
// sendrecv waits on both directions at once and a ring of ranks always progresses.
//
// Connecting. The rail's local_address() carries the same-host identity (launcher host entry, boot
// id, network namespace inode) plus pid, process start time, a random nonce and an abstract unix
// socket name derived from the job secret and the nonce (shm_address.h). connect() treats the ranks
// whose identity differs as unreachable (reaches() false, data calls to them throw InvalidArgument),
// creates its segment as a sealed memfd and starts serving it (shm_pair_handoff.h); it waits for no
// peer. A pair is linked on its first data call, from either end: that rank fetches the peer's
// segment fd over the peer's abstract socket, handing over its own in the same exchange, and maps
// it. Segments never have a name in /dev/shm, so nothing can be left behind, even when every rank
// is SIGKILLed: the kernel frees a memfd with its last mapping.
//
// Why on first use. A full mesh at connect costs a host n^2 handoffs and every rank n mappings, and
// made start-up grow faster than the job; the algorithms talk to few partners (ring neighbours,
// log-step partners, the host lane's leader), so a rank now pays for those only. A host-wide arena
// made by one rank would also make the handoffs O(n), but every rank would still map every ring of
// the host (n^2 rings' address space per rank), and one creator would hold every rank's rings; a
// segment per rank keeps each rank's doorbell, closed flag and lifetime its own.
// The handoff is served by a thread of its own, so a first transfer never waits for the other end
// to enter a data call.
//
// Large messages. A message larger than the ring cannot be buffered anyway, so where the receiver
// can read the sender's memory (threads of one process; process_vm_readv between processes, probed
// when the receiver links the pair) only its header goes through the ring and the receiver copies the payload straight
// from the sender's buffer: one copy instead of two. Elsewhere it streams through the ring.
//
// Memory. A rank's segment holds one ring per local peer; past segment_budget / ring_bytes local
// peers the rings shrink (never below kMinRingBytes) so that a segment stays within the budget; a
// rank maps its own and its partners' segments only.
//
// Waiting (shm_ring.h). A blocked call spins for spin_us, then sleeps on its doorbell futex in slices
// of liveness_slice_ms; after each slice it checks, through pidfds, that the peers it waits for are
// alive, so a killed peer is named within a slice and a frozen one at the deadline (TimeoutError
// naming peer and rail). abort() rings this rank's doorbell and the doorbell of every peer that
// linked the pair from either end (a peer blocked on us has, and handed us its segment doing so),
// and wakes a first link waiting for a segment, so every waiter wakes at once; peers see this rank's
// segment marked closed and fail with PeerError. A first link polls the peer's pidfd and its
// socket: a killed peer is named at once, a frozen one at the deadline.
//
// Threads. As rail.h: one data thread; abort(), counters(), properties() from any thread. The
// segment server's thread hands out this rank's segment and maps the segments peers send along
// (offered_). mu_ keeps abort() and the server off the mappings while connect/reset/close or a
// first link change them; the data thread is the only writer of a Link, and it writes the fields
// others read under mu_.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/rail.h"
#include "transport/rail_factory.h"
#include "transport/shm/shm_address.h"
#include "transport/shm/shm_handoff.h"
#include "transport/shm/shm_pair_handoff.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm/shm_segment.h"

namespace nezha::transport {

struct ShmRailConfig {
  std::string name = "shm";
  std::string secret;              // job secret: job tag in the segment header, socket name
  std::string host_id;             // launcher host entry (placement); may be empty
  size_t ring_bytes = 1 << 20;     // per ordered pair of local ranks (see benchmarks/RESULTS.md);
                                   // the largest: the rings of many local ranks are smaller (Memory)
  size_t segment_budget = size_t{64} << 20;  // rings of one segment in all, where >= kMinRingBytes each
  size_t chunk_bytes = 256 << 10;  // largest copy before head/tail is published
  double spin_us = 20;             // busy-wait before sleeping on the futex
  double liveness_slice_ms = 50;   // futex sleep slice; peers' pidfds are checked after each
  size_t max_share_bytes = 0;      // RailProperties::max_share_bytes (0: no limit)
  bool direct = true;              // single-copy reads of messages larger than the ring (shm_ring.h)
};

class ShmRail : public PointToPointRail {
 public:
  static constexpr size_t kMinRingBytes = size_t{64} << 10;

  ShmRail(ShmRailConfig config, int rank, int size);
  ~ShmRail() override;
  ShmRail(const ShmRail&) = delete;
  ShmRail& operator=(const ShmRail&) = delete;

  std::string local_address() const override;
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override;
  void close() override;
  bool reaches(int peer) const override;
  // Launcher host entry, boot id and network namespace (the same-host rule of shm_address.h).
  std::string host_key(const std::string& address) const override;

  const RailProperties& properties() const override { return properties_; }
  const ShmRailConfig& config() const { return config_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override;
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override;
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                     int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                     const Deadline& deadline) override;
  // A whole inline message (payload + its header) fits in an empty ring.
  size_t send_buffer_bytes() const override;
  RailCounters counters() const override;
  void abort(const std::string& reason) override;

  // Segment handoffs since connect(): the ones this rank asked for, and the ones it answered.
  // A peer that never exchanges a message with this rank appears in neither.
  struct HandoffCounts {
    uint64_t fetched = 0;
    uint64_t served = 0;
  };
  HandoffCounts handoffs() const;

 private:
  struct Link {  // this rank's view of one peer
    bool local = false;
    bool linked = false;          // segment mapped, rings and pidfd set up (first data call)
    std::string unreachable_why;  // for non-local peers
    shm::Segment segment;         // the peer's segment (holds the ring this rank fills)
    shm::RingEnd out;             // producer end, in the peer's segment
    shm::RingEnd in;              // consumer end, in this rank's segment
    int pidfd = -1;               // -1: same process (threads) or pidfd unsupported
    int32_t pid = 0;
    uint64_t direct_sent = 0;     // direct messages sent to this peer (their acks count up to it)
    std::string closed_reason;    // non-empty once this pair failed (until reset)
  };
  struct Outgoing;
  struct Incoming;

  // Data path (shm_transfer.cc).
  void transfer(Outgoing* out, Incoming* in, const Deadline& deadline);
  bool step_send(Outgoing& out);
  bool step_recv(Incoming& in);
  size_t read_direct(Incoming& in);
  bool send_done(const Outgoing& out) const;
  bool send_can_progress(const Outgoing& out) const;
  bool recv_can_progress(const Incoming& in) const;
  // Throws PeerError if the peer of a blocked call closed the pair, its rail, or exited (the last
  // only when check_process), unless can_progress() says the call can still go on.
  void check_blocked_peer(int peer, bool sending, uint64_t tag, bool check_process,
                          const std::function<bool()>& can_progress);
  Link& usable_link(int peer, const char* verb);
  // Maps the peer's segment on the first data call of the pair (offered_ or fetched), opens its
  // pidfd. Failures close the pair like a failed transfer.
  void ensure_linked(int peer, const char* verb, const Deadline& deadline);
  shm::SegmentIdentity identity_of(int peer) const;
  void serve_own_segment();
  // The segment server's delivery: a peer's segment handed over with its request.
  void offer(int peer, int fd);
  enum class FailKind { kProtocol, kTimeout, kPeer };
  // Closes the pair on both ends (the peer sees PeerError) and throws the matching error.
  [[noreturn]] void fail_pair(int peer, const std::string& what, FailKind kind);
  void throw_if_aborted() const;
  std::string where(const char* verb, int peer) const;
  void drop_links();

  // The rings of a segment for `local_ranks` ranks on this host (the same on all of them).
  size_t ring_bytes_for(size_t local_ranks) const;

  ShmRailConfig config_;
  size_t ring_bytes_;  // as connected: config_.ring_bytes or less (ring_bytes_for)
  RailProperties properties_;
  const int rank_;
  const int size_;
  shm::ShmAddress address_;
  std::string nonce_;    // raw 16 bytes
  std::string job_tag_;  // raw 16 bytes
  shm::HandoffListener listener_;
  shm::Segment own_;     // this rank's inbound segment (its fd stays open: the server hands it out)
  std::vector<Link> links_;
  std::vector<shm::ShmAddress> addrs_;  // every rank's address, as connected
  std::vector<uint32_t> slot_of_;       // rank -> its slot among this host's ranks
  uint32_t slots_ = 0;
  std::vector<uint64_t> start_times_;  // peers' process start times (pid reuse check)
  std::vector<shm::Segment> offered_;  // by rank: segments the server mapped, not yet linked (mu_)
  std::unique_ptr<shm::SegmentServer> server_;
  int abort_fd_ = -1;                  // eventfd: wakes a first link waiting for a peer's segment
  std::atomic<uint64_t> fetched_{0};
  bool connected_ = false;
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  // abort() and reaches() vs connect/reset/close touching the mappings; abort_reason_; writes of
  // Link::closed_reason (the data thread reads it without the lock: it is the only writer).
  mutable std::mutex mu_;
  std::string abort_reason_;
};

// The factory's entry for kind "shm" (rail_kinds.cc). Options: ring_bytes, chunk_bytes, spin_us,
// max_share_bytes, direct (0 turns single-copy reads off).
std::unique_ptr<Rail> make_shm_rail(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
