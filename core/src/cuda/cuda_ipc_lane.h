// CudaIpcLane: allreduce of device buffers among the ranks (processes) of one host sharing a GPU, or
// several GPUs of a host with peer access, without leaving device memory. Shaped like the shm
// collective rail (transport/shm_coll/shm_coll_rail.h) with the workspace in device memory:
//
//   * Each rank allocates a device workspace once (connect) -- `slots` chunks of chunk_bytes -- and
//     exports it with cuIpcGetMemHandle; every peer opens it once (cuIpcOpenMemHandle), so the
//     handles cross processes once per lane, never per buffer.
//   * The handles, the step counters and the slot descriptors live in a small host segment per rank:
//     the shm rail's sealed memfd (transport/shm/shm_segment.h; nothing named in /dev/shm, so
//     nothing leaks whatever kills a process), handed to the peers over its abstract unix socket with
//     the same checks (same host, job tag from the secret, nonce, pid and start time).
//   * allreduce(), per chunk: copy in (D2D into this rank's slot), all ranks ready; each rank reduces
//     its 1/n slice of the chunk from every workspace in rank order, in place in its own slot
//     (cuda/reduce_kernels.cu: the CPU kernels' operators, so every rank gets the CPU's serial bits);
//     all ready; each rank copies every rank's reduced slice out. Buffers up to small_bytes take one
//     chunk and skip the slicing: every rank reduces the whole chunk into its output (one wait less).
//     Larger buffers run chunk after chunk; a slot is reused only once every rank has copied out of
//     it (the `consumed` counter), so a rank may run `slots` - 1 chunks ahead of the slowest.
//
// Ordering across processes: host-side counters published after a stream synchronisation, not IPC
// events. Why: every wait then happens on the host, where it has a deadline, sees a peer's death
// (pidfd) and names the rank behind; a cuStreamWaitEvent on a peer's event cannot time out, and an
// event a dead peer never records reads as complete. The cost is one stream synchronisation per
// phase (three per chunk, two for a small buffer). Ranks sharing one GPU without MPS pay about
// 0.14 ms per rank per phase on an H200 whatever the spin (20 or 500 us): the GPU switching between
// the ranks' contexts, not the host's waits (8 B: 0.57 ms with 2 ranks, 1.1 with 4, 2.2 with 8).
// IPC events would keep those switches; ranks with a GPU each, or MPS, would not have them (not
// measured).
//
// Waits spin spin_us, then sleep on this rank's doorbell futex in slices of liveness_slice_ms,
// checking the peers' processes after each slice; a dead peer is named by rank on every rank (the
// rank that finds it writes the blame into its segment, as the shm rail does); the deadline gives a
// TimeoutError naming the rank behind and the phase it has not finished. After a failure the lane
// stays poisoned (every call throws, naming the first failure): its owner closes it and builds a new
// one, as the engine re-admits a failed rail. A rank that dies while a peer's kernel or copy reads
// its workspace may take that peer's CUDA context down with it (CUDA leaves an exported allocation
// freed before its importers close it undefined): the peer's error then names the dead rank beside
// the driver's message, but its context is lost, as with NCCL.
//
// How it is meant to join the engine (not wired yet; this is the building block):
//   * The engine's TensorEntry carries a device pointer and the framework's stream (torch's current
//     stream, XLA's stream in the CUDA FFI handler) instead of a host buffer for CUDA tensors; the
//     adapters stop staging through pinned memory for them.
//   * The lane's workspace becomes the fusion buffer of CUDA entries: fused tensors are copied into
//     the slot directly (the copy-in step), reduced there and copied out to each tensor, so fusion
//     costs no extra pass.
//   * It is the host lane of the hierarchical allreduce for CUDA tensors: the ranks of a host reduce
//     on the GPU, the host leaders stage only their share through pinned memory for the network
//     rails, and the result comes back through the workspace to every local rank. As a collective
//     rail it would say reach kHost, device memory, and take only CUDA entries.
//   * Operations are numbered (`seq`) by the executor, as for every collective rail; connect()
//     happens at init through the rendezvous like the shm rails (local_address() / connect()).
//
// Threads: one thread calls allreduce() at a time (the rail worker); abort() from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "common/deadline.h"
#include "common/dtype.h"
#include "cuda/cuda_ipc_control.h"
#include "cuda/reduce_args.h"
#include "transport/shm/shm_address.h"
#include "transport/shm/shm_handoff.h"
#include "transport/shm/shm_segment.h"

namespace nezha::cuda {

struct CudaIpcLaneConfig {
  std::string name = "cudaipc";
  std::string secret;              // job secret: job tag in the segments, socket name
  std::string host_id;             // launcher host entry (same-host rule); may be empty
  // One pipeline step per rank; the workspace is slots x this. Each step's three phases cost a GPU
  // context switch per rank where ranks share a GPU (~0.14 ms per rank per phase on an H200, without
  // MPS), far more than the bytes: a 64 MB allreduce of 4 ranks took 7.0 ms in 16 MB steps and 2.0 ms
  // in one (benchmarks/SHM.md, "The CUDA IPC lane on a GPU"), for 128 MB of device memory per rank.
  size_t chunk_bytes = 64 << 20;
  uint32_t slots = 2;
  size_t small_bytes = 256 << 10;  // buffers up to this are reduced whole by every rank
  double spin_us = 20;             // busy-wait before sleeping on the futex
  double liveness_slice_ms = 50;   // futex sleep slice; peers' processes are checked after each
  double close_drain_s = 5;        // close() waits this long at most for peers still reading this rank
  // Test hook: called after this rank has published a chunk's copy-in (step number since connect).
  std::function<void(uint64_t step)> after_copy_in;
};

class CudaIpcLane {
 public:
  // Checks the config; allocates nothing on the device yet (connect does). Throws InvalidArgument.
  CudaIpcLane(CudaIpcLaneConfig config, int rank, int size);
  ~CudaIpcLane();
  CudaIpcLane(const CudaIpcLane&) = delete;
  CudaIpcLane& operator=(const CudaIpcLane&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Opaque bytes the peers pass to connect() (the shm rails' address: host identity and socket).
  std::string local_address() const;
  // With the CUDA context of this rank's device current on the calling thread: allocates and exports
  // the workspace, exchanges segments with every rank (all must be on this host) and opens their
  // workspaces. Throws InvalidArgument (a rank on another host), ProtocolError, PeerError,
  // NezhaError (CUDA, naming the call) or a timeout naming the ranks missing.
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline);
  // Waits (close_drain_s at most) until every peer has copied out of this rank's workspace all it
  // needs, or has left or died (freeing memory a peer still reads is undefined in CUDA); then unmaps
  // the peers' workspaces, frees this rank's, drops the segments and stops listening. Peers that wait
  // on this rank later fail naming it. Idempotent; also run by the destructor. Final: a closed lane
  // does not connect again.
  void close();
  // Fails the operation in progress (and every later one) on this rank and its peers.
  void abort(const std::string& reason);

  // output[i] = input_0[i] (op) ... (op) input_{n-1}[i] over the ranks in rank order, times `postscale`
  // (and 1/size for Average), bit-identical on every rank. input/output: device pointers in the lane's
  // context (they may be the same buffer); `stream` (of that context) orders the copies and kernels
  // after the caller's work on it; returns once the result is in `output` (the stream synchronised).
  // Every rank calls it with the same seq, count, dtype and op (a mismatch is a ProtocolError naming
  // the rank). Throws as the class comment says.
  void allreduce(CudaDriver::DevicePtr input, CudaDriver::DevicePtr output, size_t count, DataType dtype,
                 ReduceOp op, CudaDriver::Stream stream, uint64_t seq, const Deadline& deadline,
                 double postscale = 1.0);

 private:
  struct Peer {
    transport::shm::Segment segment;  // that rank's mapped segment (empty for this rank)
    LaneControl* control = nullptr;
    CudaDriver::DevicePtr workspace = 0;  // opened (peers) or allocated (this rank)
    int pidfd = -1;
    int32_t pid = 0;
    uint64_t start_time = 0;
  };
  struct Operation;  // what every rank's descriptors must say (cuda_ipc_allreduce.cc)

  CudaDriver::DevicePtr slot(int r, uint64_t step) const;
  void run_chunk(const CudaDriver& cuda, const Operation& what, CudaDriver::DevicePtr in, CudaDriver::DevicePtr out,
                 size_t elems, double scale, CudaDriver::Stream stream, const Deadline& deadline);
  // Runs the driver's verdict through fail(): a CUDA error poisons the lane so peers stop waiting.
  void check_cuda(const CudaDriver& cuda, CudaDriver::Result r, const std::string& what);
  void write_descriptor(uint64_t step, const Operation& what);
  void launch(const CudaDriver& cuda, const Operation& what, const ReduceArgs& args, CudaDriver::Stream stream);
  // Sleeps until every rank's `counter` reaches `steps`; throws naming the rank behind and `phase`.
  void wait_all(Counter counter, uint64_t steps, const char* phase, const Deadline& deadline);
  int behind(Counter counter, uint64_t steps) const;
  void publish(Counter counter, uint64_t steps);
  void check_descriptors(uint64_t step, const Operation& what);
  void check_peers();
  int exited_peer() const;  // the first peer whose process is gone without closing; -1 if none
  void drain();             // close(): until the peers are done reading this rank's workspace
  void check_startable() const;
  template <class E>
  [[noreturn]] void fail(int blame, const std::string& what);
  void throw_if_unusable() const;
  std::string who() const;
  std::string rank_name(int r) const { return "rank " + std::to_string(r); }
  void release();

  CudaIpcLaneConfig config_;
  const int rank_, size_;
  size_t slot_stride_ = 0;
  transport::shm::ShmAddress address_;
  std::string nonce_, job_tag_;  // raw 16 bytes each
  transport::shm::HandoffListener listener_;
  transport::shm::Segment own_;
  std::vector<Peer> peers_;  // by rank, after connect
  CudaDriver::Context context_ = nullptr;
  uint64_t step_ = 0;  // chunks run since connect (all ranks agree)
  bool connected_ = false;
  std::atomic<bool> aborted_{false}, failed_{false};
  mutable std::mutex mu_;  // abort() vs close(); the reasons
  std::string abort_reason_, failure_;
};

}  // namespace nezha::cuda
