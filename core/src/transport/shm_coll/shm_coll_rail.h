// ShmCollRail: a collective rail (collective_rail.h) for the ranks of one host, reducing through
// shared memory the way DeepSpeed's CPU shm allreduce and oneCCL's do: every rank copies its share,
// chunk by chunk, into a workspace in its own segment that every peer maps; each rank reduces ITS
// slice of the chunk (1/n of it) straight from all ranks' workspaces, in rank order, into its own
// workspace; then every rank copies all reduced slices into its output. A chunk crosses memory three
// times per rank whatever n is (a ring moves 2(n-1)/n of the share through each pair, plus copies).
// Small shares skip the slicing: every rank reduces the whole chunk from all workspaces into its
// output (the same arithmetic in the same order on every rank, so the same bits), one wait instead of
// two.
//
// The other operations (shm_coll_pipeline.h) take two phases per chunk: every rank places its part
// in its workspace (a broadcast's root its chunk; an allgather's every rank its piece; a
// reducescatter's every rank its piece of every block), then every rank reads what it needs
// straight from the peers' workspaces (a copy of the root's chunk; every rank's piece; its own
// block's pieces of all ranks, reduced in rank order). One wait per chunk, and each byte crosses
// memory once into a workspace and once out per reader.
//
// Pipelining. A workspace holds `slots` chunks; a rank copies chunk k+1 in while peers still reduce
// chunk k, and reuses a slot only after every rank has read it (the `consumed` counter), so copy-in,
// reduce and copy-out of consecutive chunks overlap across ranks.
//
// Synchronisation (shm_coll_workspace.h). Each rank publishes three monotonic step counters in its own
// segment (copied, reduced, consumed); a waiter spins for spin_us, then sleeps on its own segment's
// doorbell futex (shm_ring.h's protocol: no lost wake-ups, no syscall while everyone is busy) in slices
// of liveness_slice_ms, checking after each slice that every peer's process is alive (pidfd) and has not
// closed its segment. A dead peer is named by rank on every rank (a rank that finds one writes its rank
// into its own segment as it fails, so ranks woken by that failure name the dead rank too); the
// deadline gives a TimeoutError naming the rank that is behind.
//
// Connecting reuses the shm rail's pieces (transport/shm/): the same address and same-host rule (host
// entry, boot id, network namespace: namespaced testbed "hosts" never share memory), sealed memfd
// segments (nothing is ever named in /dev/shm, so nothing can leak there, even under SIGKILL) and the
// fd handoff over abstract unix sockets. Unlike the shm rail it joins the whole job or nothing: every
// rank must be on this host (connect throws naming the first rank that is not), because an allreduce
// on it is the job's. Except as a host lane (host_lane, reach kHost: the hierarchical allreduce's
// phases inside a host, hierarchical_rail.h): then connect() takes the whole job's addresses and
// forms the rail of the ranks on this host, rank() and size() counting among them (in job rank
// order); errors still name job ranks.
//
// Reduction. The transport layer sits below the kernels (collectives/reduce.h); whoever builds the rail
// hands it the elementwise kernel (RailContext::reduce_into). Without one, reduces() is false.
//
// Threads. As rail.h: one data thread; abort(), counters(), properties() from any thread. With
// `threads` > 1 that thread hands parts of its copies and reductions (every operation's but an
// alltoall's, whose per-peer pieces are small) to helper threads of its own (shm_coll_crew.h) and
// waits for them; nothing else runs on them.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/collective_rail.h"
#include "transport/rail_factory.h"
#include "transport/shm/shm_address.h"
#include "transport/shm/shm_handoff.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm_coll/shm_coll_crew.h"
#include "transport/shm_coll/shm_coll_workspace.h"

namespace nezha::transport {

// More threads per rank than this add little: a few threads already move what a socket's memory can.
constexpr int kMaxShmCollThreads = 8;

struct ShmCollRailConfig {
  std::string name = "shmcoll";
  std::string secret;             // job secret: job tag in the segment header, socket name
  std::string host_id;            // launcher host entry (placement); may be empty
  ReduceKernel reduce_into = nullptr;  // dst op= src (collectives/reduce.h); null: reduces nothing
  size_t chunk_bytes = 512 << 10;  // one pipeline step of the share, per rank: ranks x slots x chunk
                                   // stay in a last-level cache (benchmarks/SHM.md)
  uint32_t slots = 4;              // chunks in flight per workspace
  size_t small_bytes = 32 << 10;   // shares up to this are reduced whole by every rank (one wait)
  double spin_us = 20;             // busy-wait before sleeping on the futex
  double liveness_slice_ms = 50;   // futex sleep slice; peers' processes are checked after each
  size_t max_share_bytes = 0;      // RailProperties::max_share_bytes (0: no limit)
  bool host_lane = false;          // reach kHost: the rail of this host's ranks (see above)
  // Threads per rank that copy and reduce each chunk (shm_coll_crew.h), the rail's own
  // included; the maker gives more than 1 only where the host's cores outnumber its ranks.
  int threads = 1;
  size_t thread_min_bytes = 32 << 10;  // a copy or reduction is cut only into pieces this large
};

class ShmCollRail final : public CollectiveRail {
 public:
  ShmCollRail(ShmCollRailConfig config, int rank, int size);
  ~ShmCollRail() override;
  ShmCollRail(const ShmCollRail&) = delete;
  ShmCollRail& operator=(const ShmCollRail&) = delete;

  const RailProperties& properties() const override { return properties_; }
  const ShmCollRailConfig& config() const { return config_; }
  // Among this host's ranks for a host lane, once connected.
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string local_address() const override;
  std::string host_key(const std::string& address) const override;
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override;
  void close() override;
  RailCounters counters() const override;
  void abort(const std::string& reason) override;

  bool reduces(DataType dtype, ReduceOp op) const override;
  bool runs(CollectiveOp op) const override;  // all five (reducing ones with a kernel given)
  std::unique_ptr<CollectiveRequest> start_allreduce(const void* input, void* output, size_t count,
                                                      DataType dtype, ReduceOp op, uint64_t seq,
                                                      OverwriteHook before_overwrite = {}) override;
  std::unique_ptr<CollectiveRequest> start_broadcast(void* buf, size_t bytes, int root, uint64_t seq) override;
  std::unique_ptr<CollectiveRequest> start_allgather(const void* input, const std::vector<uint8_t*>& output_blocks,
                                                      const std::vector<size_t>& bytes_per_rank,
                                                      uint64_t seq) override;
  std::unique_ptr<CollectiveRequest> start_reducescatter(const std::vector<const uint8_t*>& input_blocks,
                                                          void* output, const std::vector<size_t>& counts,
                                                          DataType dtype, ReduceOp op, uint64_t seq) override;
  std::unique_ptr<CollectiveRequest> start_alltoall(const std::vector<const uint8_t*>& send_blocks,
                                                     const std::vector<uint8_t*>& recv_blocks,
                                                     const std::vector<size_t>& bytes_matrix, uint64_t seq) override;

 private:
  class Request;    // an allreduce (shm_coll_allreduce.cc), on the Pipeline
  class Pipeline;   // the chunk pipeline every operation runs on (shm_coll_pipeline.h)
  class Broadcast;  // shm_coll_ops.cc
  class Allgather;
  class Reducescatter;
  class Alltoall;
  // What an operation is, as every rank's slot descriptors must say for each of its steps.
  struct OpIdentity {
    CollectiveOp kind = CollectiveOp::kAllreduce;
    uint64_t seq = 0;
    uint64_t count = 0;  // elements, or bytes where nothing is reduced
    DataType dtype = DataType::kUInt8;
    ReduceOp op = ReduceOp::kSum;
    int root = -1;
    uint64_t layout = 0;
  };
  struct Peer {  // this rank's view of one rank, itself included
    shm::Segment segment;  // that rank's mapped segment (empty for this rank: own_ holds it)
    shm_coll::Workspace ws;
    int pidfd = -1;        // -1: this rank, a thread of this process, or pidfd unsupported
    int32_t pid = 0;
    uint64_t start_time = 0;
  };

  // Sleeps until ready() returns -1 (it returns the rank still behind otherwise), spinning first.
  // Throws as CollectiveRequest::wait does; *phase names what the rank behind has not done yet.
  template <class Ready>
  void wait_until(Ready ready, const char* const* phase, const Deadline& deadline);
  // After a sleep, waiting on rank `waiting_on`: throws PeerError if a peer's process is gone, a
  // closed peer blames another, or `waiting_on` closed its segment. Another peer that closed without
  // blame is not a failure: it finished its part of the operation first (a reducescatter's rank with
  // an empty block) and left, and what it published stays readable.
  void check_peers(int waiting_on);
  // Rings every other rank's doorbell if it may sleep (after this rank published a counter).
  void notify_peers();
  // Poisons the rail: marks this rank's segment closed (with the rank to blame, -1 if none) so
  // peers fail too, and throws `error`.
  template <class E>
  [[noreturn]] void fail(int blame, const std::string& what);
  void throw_if_unusable() const;
  // Throws as start_* does when the rail cannot start `what` (aborted, failed, not connected).
  void check_startable() const;
  void write_descriptor(uint64_t step, const OpIdentity& what);
  // Every rank's descriptor of `step` must say `what`: fails the rail (ProtocolError) naming the first
  // rank whose does not, and what it runs.
  void check_descriptors(uint64_t step, const OpIdentity& what);
  std::string who() const;  // "rail 'shmcoll', rank R" (the job rank)
  void drop_segments();
  // The job rank of rank `index` of the rail (they differ only on a host lane).
  int job_rank_of(int index) const { return members_.empty() ? index : members_[static_cast<size_t>(index)]; }
  std::string rank_name(int index) const { return "rank " + std::to_string(job_rank_of(index)); }

  ShmCollRailConfig config_;
  RailProperties properties_;
  const int job_rank_, job_size_;
  int rank_, size_;           // in the rail: the job's, or among this host's ranks (host lane)
  std::vector<int> members_;  // host lane, connected: the job ranks of the rail's ranks, ascending
  shm::ShmAddress address_;
  std::string nonce_;    // raw 16 bytes
  std::string job_tag_;  // raw 16 bytes
  shm::HandoffListener listener_;
  shm::Segment own_;
  std::vector<Peer> peers_;  // by rank, after connect
  std::unique_ptr<shm_coll::Crew> crew_;  // threads > 1 only
  uint64_t step_ = 0;        // chunks this rank has started on the rail since connect (all ranks agree)
  bool connected_ = false;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
  mutable std::mutex mu_;  // abort() vs connect/reset/close changing the mappings; the reasons
  std::string abort_reason_;
  std::string failure_;
};

std::unique_ptr<Rail> make_shm_coll_rail(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
