// CudaIpcLane's lifecycle: construction, connect (workspace, segments, IPC handles), close, abort,
// and the failure bookkeeping shared with the data path (cuda_ipc_allreduce.cc).
#include "cuda/cuda_ipc_lane.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <type_traits>

#include "common/error.h"
#include "transport/shm/shm_ring.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace nezha::cuda {

namespace shm = transport::shm;

namespace {

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

}  // namespace

CudaIpcLane::CudaIpcLane(CudaIpcLaneConfig config, int rank, int size)
    : config_(std::move(config)), rank_(rank), size_(size) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("CUDA IPC lane '" + config_.name + "': rank " + std::to_string(rank) +
                          " is outside a job of " + std::to_string(size) + " ranks");
  if (size > kMaxReduceRanks)
    throw InvalidArgument("CUDA IPC lane '" + config_.name + "': " + std::to_string(size) + " ranks; at most " +
                          std::to_string(kMaxReduceRanks) + " share one lane");
  if (config_.chunk_bytes < 4096 || config_.chunk_bytes % 256 || config_.slots < 1 ||
      config_.slots > kMaxLaneSlots || config_.small_bytes > config_.chunk_bytes)
    throw InvalidArgument("CUDA IPC lane '" + config_.name + "': chunk_bytes must be a multiple of 256 of at least "
                          "4096, slots in [1, " + std::to_string(kMaxLaneSlots) +
                          "] and small_bytes at most chunk_bytes");
  slot_stride_ = round_up(config_.chunk_bytes, 256);
  shm::LocalEndpoint endpoint = shm::make_local_endpoint("cudaipc", config_.secret, config_.host_id);
  job_tag_ = std::move(endpoint.job_tag);
  nonce_ = std::move(endpoint.nonce);
  address_ = std::move(endpoint.address);
  listener_ = shm::HandoffListener(address_.socket_name);
}

CudaIpcLane::~CudaIpcLane() { close(); }

std::string CudaIpcLane::who() const {
  return "CUDA IPC lane '" + config_.name + "', rank " + std::to_string(rank_);
}

std::string CudaIpcLane::local_address() const { return shm::encode_address(address_); }

void CudaIpcLane::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument(who() + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_unusable();
  if (connected_) throw NezhaError(who() + " is already connected");
  if (listener_.fd() < 0) throw NezhaError(who() + " is closed; build a new lane");
  std::vector<shm::ShmAddress> addrs;
  std::vector<shm::HandoffPeer> others;
  for (int r = 0; r < size_; ++r) {
    shm::ShmAddress a = r == rank_ ? address_
                                   : shm::decode_address(addresses_by_rank[r], who() + ": connect to rank " +
                                                                                   std::to_string(r));
    const std::string mismatch = shm::same_host_mismatch(address_, a);
    if (!mismatch.empty())
      throw InvalidArgument(who() + ": rank " + std::to_string(r) + " is not on this host (" + mismatch +
                            "); a CUDA IPC lane joins only ranks of one host");
    if (r != rank_) others.push_back({r, a, shm::from_hex(a.nonce_hex, who() + ": rank " + std::to_string(r) + "'s address")});
    addrs.push_back(std::move(a));
  }
  const CudaDriver& cuda = CudaDriver::get();
  cuda.check(cuda.ctx_get_current(&context_), "cuCtxGetCurrent (CUDA IPC lane connect)");
  if (context_ == nullptr) throw NezhaError(who() + ": connect() needs the CUDA context of this rank's device current");
  peers_.clear();
  peers_.resize(static_cast<size_t>(size_));
  try {
    Peer& me = peers_[rank_];
    cuda.check(cuda.mem_alloc(&me.workspace, slot_stride_ * config_.slots),
               ("cuMemAlloc of the lane's workspace (" + std::to_string(slot_stride_ * config_.slots) + " bytes)").c_str());
    const uint64_t control_bytes = round_up(sizeof(LaneControl), 64);
    own_ = shm::Segment::create({job_tag_, nonce_, address_.pid, address_.start_time, rank_, 1, control_bytes});
    me.control = new (own_.ring_data(0)) LaneControl();
    cuda.check(cuda.ipc_get_mem_handle(&me.control->workspace_handle, me.workspace), "cuIpcGetMemHandle of the workspace");
    me.control->chunk_bytes = config_.chunk_bytes;
    me.control->small_bytes = config_.small_bytes;
    me.control->slot_stride = slot_stride_;
    me.control->slots = config_.slots;
    CudaDriver::Device dev = 0;
    cuda.check(cuda.ctx_get_device(&dev), "cuCtxGetDevice");
    cuda.check(cuda.device_get_pci_bus_id(me.control->pci_bus_id, sizeof me.control->pci_bus_id, dev),
               "cuDeviceGetPCIBusId");
    std::vector<int> fds = shm::exchange_segment_fds(listener_, rank_, nonce_, own_.fd(), others, aborted_, deadline,
                                                     config_.name);
    own_.release_fd();
    for (size_t i = 0; i < others.size(); ++i) {  // each fd is owned by its Segment from here on
      const int r = others[i].rank;
      const shm::SegmentIdentity expect{job_tag_, others[i].nonce, addrs[r].pid, addrs[r].start_time, r, 1, control_bytes};
      try {
        peers_[r].segment = shm::Segment::attach(fds[i], expect, who() + ": connect to " + rank_name(r));
      } catch (const NezhaError& e) {
        for (size_t j = i + 1; j < others.size(); ++j) ::close(fds[j]);
        throw ProtocolError(e.what());
      }
    }
    for (int r = 0; r < size_; ++r) {
      Peer& p = peers_[r];
      p.pid = addrs[r].pid;
      p.start_time = addrs[r].start_time;
      if (r == rank_) continue;
      p.control = reinterpret_cast<LaneControl*>(p.segment.ring_data(0));
      if (p.control->chunk_bytes != config_.chunk_bytes || p.control->slots != config_.slots ||
          p.control->small_bytes != config_.small_bytes)
        throw ProtocolError(who() + ": " + rank_name(r) + "'s lane has " + std::to_string(p.control->slots) + " x " +
                            std::to_string(p.control->chunk_bytes) + "-byte slots (whole up to " +
                            std::to_string(p.control->small_bytes) + " bytes), this rank's " +
                            std::to_string(config_.slots) + " x " + std::to_string(config_.chunk_bytes) + " (" +
                            std::to_string(config_.small_bytes) + ")");
      if (p.pid != address_.pid) {
        p.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
        if (shm::process_start_time(p.pid) != p.start_time)
          throw PeerError(r, who() + ": connect to " + rank_name(r) + ": its process (pid " + std::to_string(p.pid) +
                                 ") is gone");
      }
      // Ranks on other GPUs of this host need peer access, which the lazy flag enables as needed.
      const std::string what = "cuIpcOpenMemHandle of " + rank_name(r) + "'s workspace (its GPU " +
                               std::string(p.control->pci_bus_id) + ", this rank's " + me.control->pci_bus_id + ")";
      cuda.check(cuda.ipc_open_mem_handle(&p.workspace, p.control->workspace_handle, CudaDriver::kIpcLazyEnablePeerAccess),
                 what.c_str());
    }
  } catch (...) {
    release();
    throw;
  }
  step_ = 0;
  connected_ = true;
}

void CudaIpcLane::drain() {
  // A peer may still copy the last chunk's reduced slices out of this rank's slots after this rank
  // has finished: it is done once its `consumed` reaches this rank's step count (all ranks run the
  // same steps), or once it has left or died.
  if (!connected_ || !own_.valid()) return;
  const Deadline deadline = Deadline::after_seconds(config_.close_drain_s);
  for (;;) {
    bool busy = false;
    for (int r = 0; r < size_ && !busy; ++r) {
      if (r == rank_) continue;
      const Peer& p = peers_[r];
      busy = p.control->counter(Counter::kConsumed).load() < step_ && p.segment.header()->closed.load() == 0 &&
             !shm::process_exited(p.pidfd, p.pid, p.start_time);
    }
    if (!busy || deadline.expired()) return;
    ::usleep(500);
  }
}

void CudaIpcLane::release() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (own_.valid()) {
      own_.header()->closed.store(1);
      shm::ring_doorbell(own_.header());
    }
    for (Peer& p : peers_)
      if (p.segment.valid()) shm::ring_doorbell(p.segment.header());  // peers waiting on us see closed
  }
  bool any_device_memory = false;
  for (const Peer& p : peers_) any_device_memory |= p.workspace != 0;
  if (any_device_memory && context_ != nullptr) {
    // Errors are ignored here: this runs in destructors and after failures (a dead context included).
    const CudaDriver& cuda = CudaDriver::get();
    if (cuda.ctx_push_current(context_) == 0) {
      for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
        if (peers_[r].workspace == 0) continue;
        if (r == rank_) cuda.mem_free(peers_[r].workspace);
        else cuda.ipc_close_mem_handle(peers_[r].workspace);
      }
      CudaDriver::Context popped = nullptr;
      cuda.ctx_pop_current(&popped);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Peer& p : peers_)
    if (p.pidfd >= 0) ::close(p.pidfd);
  peers_.clear();
  own_.unmap();
  connected_ = false;
}

void CudaIpcLane::close() {
  release();
  listener_.close();
}

void CudaIpcLane::abort(const std::string& reason) {
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

void CudaIpcLane::throw_if_unusable() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw NezhaError(who() + " aborted: " + abort_reason_);
  if (failed_) throw PeerError(size_, who() + " failed earlier (" + failure_ + "); close it and build a new lane");
}

void CudaIpcLane::check_startable() const {
  throw_if_unusable();
  if (!connected_) throw NezhaError(who() + " is not connected");
}

template <class E>
void CudaIpcLane::fail(int blame, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    if (failure_.empty()) failure_ = what;
    if (own_.valid()) {
      own_.header()->closed.store(1);
      if (blame >= 0 && blame != rank_) peers_[rank_].control->steps.blame.store(blame);
    }
  }
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)  // wake them all: they fail too
    if (r != rank_ && peers_[r].segment.valid()) shm::ring_doorbell(peers_[r].segment.header());
  if (aborted_) {
    std::lock_guard<std::mutex> lock(mu_);
    throw NezhaError(who() + " aborted: " + abort_reason_);
  }
  if constexpr (std::is_same_v<E, ProtocolError> || std::is_same_v<E, NezhaError>) throw E(what);
  else throw E(blame < 0 ? size_ : blame, what);
}

template void CudaIpcLane::fail<PeerError>(int, const std::string&);
template void CudaIpcLane::fail<TimeoutError>(int, const std::string&);
template void CudaIpcLane::fail<ProtocolError>(int, const std::string&);
template void CudaIpcLane::fail<NezhaError>(int, const std::string&);

int CudaIpcLane::exited_peer() const {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers_[r];
    if (p.segment.header()->closed.load() == 0 && shm::process_exited(p.pidfd, p.pid, p.start_time)) return r;
  }
  return -1;
}

void CudaIpcLane::check_peers() {
  // As the shm collective rail: the root cause is a rank gone without closing, else the rank a closed
  // one blames, else the first rank that left.
  int gone = -1, blamed = -1, blamer = -1, left = -1;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers_[r];
    const bool closed = p.segment.header()->closed.load() != 0;
    const int blame = closed ? p.control->steps.blame.load() : -1;
    if (!closed && shm::process_exited(p.pidfd, p.pid, p.start_time)) {
      gone = r;
      break;
    }
    if (closed && blame >= 0 && blame != rank_ && blamed < 0) {
      blamed = blame;
      blamer = r;
    }
    if (closed && left < 0) left = r;
  }
  if (gone >= 0)
    fail<PeerError>(gone, who() + ": " + rank_name(gone) + " (pid " + std::to_string(peers_[gone].pid) + ") exited");
  if (blamed >= 0)
    fail<PeerError>(blamed, who() + ": " + rank_name(blamed) + " is gone or stuck (reported by " + rank_name(blamer) + ")");
  if (left >= 0) fail<PeerError>(left, who() + ": " + rank_name(left) + " left the lane (aborted, failed or closed)");
}

}  // namespace nezha::cuda
