#include "transport/shm_coll/shm_coll_rail.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <type_traits>

#include "common/error.h"
#include "transport/shm/shm_ring.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace nezha::transport {

ShmCollRail::ShmCollRail(ShmCollRailConfig config, int rank, int size)
    : config_(std::move(config)), job_rank_(rank), job_size_(size), rank_(rank), size_(size) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("rail '" + config_.name + "': rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  if (config_.chunk_bytes < 4096 || config_.chunk_bytes % 64 || config_.slots < 2 || config_.slots > 64 ||
      config_.small_bytes > config_.chunk_bytes || config_.threads < 1 || config_.threads > kMaxShmCollThreads)
    throw InvalidArgument("rail '" + config_.name + "': chunk_bytes must be a multiple of 64 of at least 4096, "
                          "slots in [2, 64], small_bytes at most chunk_bytes and threads in [1, " +
                          std::to_string(kMaxShmCollThreads) + "]");
  if (config_.threads > 1)
    crew_ = std::make_unique<shm_coll::Crew>(config_.threads, config_.thread_min_bytes, config_.spin_us,
                                             "nz-shmcoll-" + std::to_string(rank));
  properties_.name = config_.name;
  properties_.kind = "shmcoll";
  properties_.local_addr = "shmcoll:" + config_.host_id;
  // The whole job, all on this host (connect checks), or a host lane: this host's ranks.
  properties_.reach = config_.host_lane ? RailReach::kHost : RailReach::kJob;
  // Priors until calibration: two futex round trips at worst, and each byte crossing memory three
  // times per rank (copy in, reduce, copy out) against a ring's copies through the p2p shm rail.
  properties_.latency_us_prior = 5;
  properties_.gbps_prior = 60;
  properties_.max_share_bytes = config_.max_share_bytes;
  properties_.host_memory = true;
  properties_.can_fail_alone = false;  // shared memory: fails only with a rank
  // Unguessable without the secret, tied to this instance; abstract, so it vanishes with us.
  shm::LocalEndpoint endpoint = shm::make_local_endpoint("shmcoll", config_.secret, config_.host_id);
  job_tag_ = std::move(endpoint.job_tag);
  nonce_ = std::move(endpoint.nonce);
  address_ = std::move(endpoint.address);
  listener_ = shm::HandoffListener(address_.socket_name);
}

ShmCollRail::~ShmCollRail() { close(); }

std::string ShmCollRail::who() const { return "rail '" + config_.name + "', rank " + std::to_string(job_rank_); }

std::string ShmCollRail::host_key(const std::string& address) const {
  if (!config_.host_lane) return {};
  return shm::host_key(shm::decode_address(address, who() + ": host_key"));
}

std::string ShmCollRail::local_address() const { return shm::encode_address(address_); }

RailCounters ShmCollRail::counters() const { return {bytes_sent_.load(), bytes_received_.load()}; }

bool ShmCollRail::reduces(DataType dtype, ReduceOp op) const {
  // Every dtype x op the kernels take (kAverage as kSum: the caller scales).
  return config_.reduce_into != nullptr && is_valid_dtype(static_cast<int>(dtype)) &&
         is_valid_reduce_op(static_cast<int>(op));
}

bool ShmCollRail::runs(CollectiveOp op) const {
  // Moving bytes needs no kernel; reducing does.
  return op == CollectiveOp::kBroadcast || op == CollectiveOp::kAllgather || op == CollectiveOp::kAlltoall ||
         config_.reduce_into != nullptr;
}

void ShmCollRail::check_startable() const {
  throw_if_unusable();
  if (!connected_) throw NezhaError(who() + " is not connected");
}

void ShmCollRail::write_descriptor(uint64_t step, const OpIdentity& what) {
  shm_coll::SlotDescriptor& d = peers_[rank_].ws.descriptor(step);
  d = {step,
       what.seq,
       what.count,
       static_cast<uint32_t>(what.dtype),
       static_cast<uint32_t>(what.op),
       static_cast<uint32_t>(what.kind),
       what.root,
       what.layout};
}

namespace {

std::string describe(CollectiveOp kind, uint64_t seq, uint64_t count, uint32_t dtype, uint32_t op, int root) {
  std::string s = std::string(collective_op_name(kind)) + " #" + std::to_string(seq) + " of " + std::to_string(count);
  switch (kind) {
    case CollectiveOp::kAllreduce:
    case CollectiveOp::kReducescatter:
      s += " elements (";
      s += is_valid_dtype(static_cast<int>(dtype)) ? dtype_name(static_cast<DataType>(dtype)) : "dtype " + std::to_string(dtype);
      s += " with ";
      s += is_valid_reduce_op(static_cast<int>(op)) ? reduce_op_name(static_cast<ReduceOp>(op)) : "op " + std::to_string(op);
      return s + ")";
    case CollectiveOp::kBroadcast:
      return s + " bytes from rank " + std::to_string(root);
    case CollectiveOp::kAllgather:
    case CollectiveOp::kAlltoall:
      return s + " bytes";
  }
  return s;
}

}  // namespace

void ShmCollRail::check_descriptors(uint64_t step, const OpIdentity& what) {
  for (int r = 0; r < size_; ++r) {
    const shm_coll::SlotDescriptor& d = peers_[r].ws.descriptor(step);
    if (d.step == step && d.seq == what.seq && d.count == what.count && d.dtype == static_cast<uint32_t>(what.dtype) &&
        d.op == static_cast<uint32_t>(what.op) && d.kind == static_cast<uint32_t>(what.kind) &&
        d.root == what.root && d.layout == what.layout)
      continue;
    const bool known_kind = d.kind <= static_cast<uint32_t>(CollectiveOp::kAlltoall);
    const std::string theirs = known_kind ? describe(static_cast<CollectiveOp>(d.kind), d.seq, d.count, d.dtype, d.op, d.root)
                                          : "operation kind " + std::to_string(d.kind);
    const std::string sizes = d.layout != what.layout && theirs == describe(what.kind, what.seq, what.count,
                                                                            static_cast<uint32_t>(what.dtype),
                                                                            static_cast<uint32_t>(what.op), what.root)
                                  ? " with other per-rank sizes"
                                  : "";
    fail<ProtocolError>(-1, who() + ": " + rank_name(r) + " runs " + theirs + sizes + " where this rank runs " +
                                describe(what.kind, what.seq, what.count, static_cast<uint32_t>(what.dtype),
                                         static_cast<uint32_t>(what.op), what.root));
  }
}

void ShmCollRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != job_size_)
    throw InvalidArgument(who() + ": connect() got " + std::to_string(addresses_by_rank.size()) + " addresses for " +
                          std::to_string(job_size_) + " ranks");
  throw_if_unusable();
  drop_segments();
  failed_ = false;
  // The rail's ranks: the job's, or on a host lane those whose address says this host.
  std::vector<int> members;
  std::vector<shm::ShmAddress> addrs;
  for (int j = 0; j < job_size_; ++j) {
    shm::ShmAddress a = j == job_rank_ ? address_
                                       : shm::decode_address(addresses_by_rank[j], who() + ": connect to rank " +
                                                                                       std::to_string(j));
    const std::string mismatch = shm::same_host_mismatch(address_, a);
    if (!mismatch.empty() && config_.host_lane) continue;
    if (!mismatch.empty())
      throw InvalidArgument(who() + ": rank " + std::to_string(j) + " is not on this host (" + mismatch +
                            "); a shmcoll rail joins only jobs whose ranks all share one host");
    members.push_back(j);
    addrs.push_back(std::move(a));
  }
  rank_ = static_cast<int>(std::find(members.begin(), members.end(), job_rank_) - members.begin());
  size_ = static_cast<int>(members.size());
  members_ = config_.host_lane ? members : std::vector<int>{};
  std::vector<shm::HandoffPeer> others;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string nonce = shm::from_hex(addrs[r].nonce_hex, who() + ": " + rank_name(r) + "'s address");
    others.push_back({r, addrs[r], nonce});
  }
  const uint64_t ws_bytes = shm_coll::workspace_bytes(config_.chunk_bytes, config_.slots);
  shm::SegmentIdentity id{job_tag_, nonce_, address_.pid, address_.start_time, rank_, 1, ws_bytes};
  shm::Segment own = shm::Segment::create(id);
  new (own.ring_data(0)) shm_coll::WorkspaceControl();
  std::vector<int> fds = shm::exchange_segment_fds(listener_, rank_, nonce_, own.fd(), others, aborted_, deadline,
                                                   config_.name);
  own.release_fd();
  std::vector<Peer> peers(static_cast<size_t>(size_));
  std::string failure;
  for (size_t i = 0; i < others.size(); ++i) {  // each fd is owned by its Segment from here on
    const int r = others[i].rank;
    shm::SegmentIdentity expect{job_tag_, others[i].nonce, addrs[r].pid, addrs[r].start_time, r, 1, ws_bytes};
    try {
      peers[r].segment = shm::Segment::attach(fds[i], expect, who() + ": connect to " + rank_name(r));
    } catch (const NezhaError& e) {
      for (size_t j = i + 1; j < others.size(); ++j) ::close(fds[j]);
      throw ProtocolError(e.what());
    }
  }
  for (int r = 0; r < size_; ++r) {
    Peer& p = peers[r];
    uint8_t* base = r == rank_ ? own.ring_data(0) : p.segment.ring_data(0);
    p.ws = shm_coll::Workspace::at(base, config_.chunk_bytes, config_.slots);
    p.pid = addrs[r].pid;
    p.start_time = addrs[r].start_time;
    if (r == rank_ || p.pid == address_.pid) continue;
    p.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
    // The pid may have been reused since the address was made: the start time must still match.
    if (shm::process_start_time(p.pid) != p.start_time) {
      for (Peer& opened : peers)
        if (opened.pidfd >= 0) ::close(opened.pidfd);
      throw PeerError(job_rank_of(r), who() + ": connect to " + rank_name(r) + ": its process (pid " +
                             std::to_string(p.pid) + ") is gone");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  own_ = std::move(own);
  peers_ = std::move(peers);
  step_ = 0;
  failure_.clear();
  connected_ = true;
}

void ShmCollRail::drop_segments() {
  std::lock_guard<std::mutex> lock(mu_);
  if (own_.valid()) {
    own_.header()->closed.store(1);
    shm::ring_doorbell(own_.header());
  }
  for (Peer& p : peers_) {
    if (p.segment.valid()) shm::ring_doorbell(p.segment.header());  // peers waiting on us see closed
    if (p.pidfd >= 0) ::close(p.pidfd);
    p.pidfd = -1;
  }
  peers_.clear();
  own_.unmap();
  connected_ = false;
}

void ShmCollRail::reset() {
  drop_segments();
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  failed_ = false;
  abort_reason_.clear();
  failure_.clear();
}

void ShmCollRail::close() {
  drop_segments();
  listener_.close();
}

void ShmCollRail::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_reason_.empty()) abort_reason_ = reason;
  aborted_ = true;
  if (own_.valid()) {
    own_.header()->closed.store(1);
    shm::ring_doorbell(own_.header());  // our own waiter
  }
  for (Peer& p : peers_)
    if (p.segment.valid()) shm::ring_doorbell(p.segment.header());  // peers blocked on us
}

void ShmCollRail::throw_if_unusable() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw NezhaError(who() + " aborted: " + abort_reason_);
  if (failed_) throw PeerError(job_size_, who() + " failed earlier (" + failure_ + "); awaiting re-admission");
}

template <class E>
void ShmCollRail::fail(int blame, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    if (failure_.empty()) failure_ = what;
    if (own_.valid()) {
      own_.header()->closed.store(1);
      if (blame >= 0 && blame != rank_) peers_[rank_].ws.control->blame.store(blame);
    }
  }
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)  // wake them all: they fail too
    if (r != rank_) shm::ring_doorbell(peers_[r].segment.header());
  if (aborted_) {
    std::lock_guard<std::mutex> lock(mu_);
    throw NezhaError(who() + " aborted: " + abort_reason_);
  }
  if constexpr (std::is_same_v<E, ProtocolError>) throw ProtocolError(what);
  else throw E(blame < 0 ? job_size_ : job_rank_of(blame), what);
}

template void ShmCollRail::fail<PeerError>(int, const std::string&);
template void ShmCollRail::fail<TimeoutError>(int, const std::string&);
template void ShmCollRail::fail<ProtocolError>(int, const std::string&);

void ShmCollRail::notify_peers() {
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)
    if (r != rank_) shm::ring_doorbell_if_sleeping(peers_[r].segment.header());
}

void ShmCollRail::check_peers(int waiting_on) {
  // A rank that failed closes its segment and names the rank it failed on, then may exit: the root
  // cause is a rank that is gone without closing, else the rank a closed one blames.
  int gone = -1, blamed = -1, blamer = -1, left = -1;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers_[r];
    const bool closed = p.segment.header()->closed.load() != 0;
    const int blame = closed ? p.ws.control->blame.load() : -1;
    if (!closed && shm::process_exited(p.pidfd, p.pid, p.start_time)) {
      gone = r;
      break;
    }
    if (closed && blame >= 0 && blame != rank_ && blamed < 0) {
      blamed = blame;
      blamer = r;
    }
    if (closed && r == waiting_on) left = r;
  }
  if (gone >= 0)
    fail<PeerError>(gone, who() + ": " + rank_name(gone) + " (pid " + std::to_string(peers_[gone].pid) + ") exited");
  if (blamed >= 0)
    fail<PeerError>(blamed, who() + ": " + rank_name(blamed) + " is gone or stuck (reported by " + rank_name(blamer) +
                                ")");
  if (left >= 0)
    fail<PeerError>(left, who() + ": " + rank_name(left) + " left the rail (aborted, failed or closed)");
}

}  // namespace nezha::transport
