// CudaIpcLane's data path: the allreduce pipeline of cuda_ipc_lane.h, its host-side waits and the
// slot descriptors every rank checks.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"
#include "cuda/cuda_ipc_lane.h"
#include "cuda/reduce_module.h"
#include "transport/collective_rail.h"
#include "transport/shm/shm_ring.h"

namespace nezha::cuda {

namespace shm = transport::shm;

struct CudaIpcLane::Operation {
  uint64_t seq;
  uint64_t count;  // elements of the whole allreduce
  DataType dtype;
  ReduceOp op;
};

namespace {

// Rank r's slice [begin(r), begin(r + 1)) of a chunk of `elems`: equal parts rounded up to 64 bytes,
// so every slice starts 64-byte aligned in the workspace (the kernels' 16-byte loads).
size_t slice_begin(size_t elems, size_t esize, int ranks, int r) {
  const size_t align = std::max<size_t>(1, 64 / esize);
  const size_t per = ((elems + ranks - 1) / ranks + align - 1) / align * align;
  return std::min(elems, per * static_cast<size_t>(r));
}

bool aligned16(CudaDriver::DevicePtr p) { return p % 16 == 0; }

const char* counter_phase(Counter c) {
  switch (c) {
    case Counter::kCopied: return "copy its chunk into its workspace";
    case Counter::kReduced: return "reduce its slice";
    case Counter::kConsumed: break;
  }
  return "copy an earlier chunk out of the workspaces";
}

}  // namespace

CudaDriver::DevicePtr CudaIpcLane::slot(int r, uint64_t step) const {
  return peers_[r].workspace + (step % config_.slots) * slot_stride_;
}

void CudaIpcLane::check_cuda(const CudaDriver& cuda, CudaDriver::Result r, const std::string& what) {
  if (r == 0) return;
  try {
    cuda.check(r, what.c_str());
  } catch (const NezhaError& e) {
    // A peer that died while this rank read its workspace is the cause: name it (cuda_ipc_lane.h).
    if (const int gone = exited_peer(); gone >= 0)
      fail<PeerError>(gone, who() + ": " + rank_name(gone) + " (pid " + std::to_string(peers_[gone].pid) +
                                ") exited, and then " + e.what());
    fail<NezhaError>(-1, who() + ": " + e.what());
  }
}

void CudaIpcLane::launch(const CudaDriver& cuda, const Operation& what, const ReduceArgs& args,
                         CudaDriver::Stream stream) {
  try {
    launch_reduce(cuda, what.dtype, what.op, args, stream);
  } catch (const NezhaError& e) {  // e.g. no kernel image for this GPU: the peers must not wait for us
    fail<NezhaError>(-1, who() + ": " + e.what());
  }
}

int CudaIpcLane::behind(Counter counter, uint64_t steps) const {
  for (int r = 0; r < size_; ++r)
    if (peers_[r].control->counter(counter).load() < steps) return r;
  return -1;
}

void CudaIpcLane::publish(Counter counter, uint64_t steps) {
  peers_[rank_].control->counter(counter).store(steps);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) shm::ring_doorbell_if_sleeping(peers_[r].segment.header());
}

void CudaIpcLane::wait_all(Counter counter, uint64_t steps, const char* phase, const Deadline& deadline) {
  using namespace std::chrono;
  const auto spin_end = Clock::now() + duration_cast<Clock::duration>(duration<double, std::micro>(config_.spin_us));
  while (Clock::now() < spin_end) {
    if (behind(counter, steps) < 0) return;
    if (aborted_) throw_if_unusable();
    shm::cpu_relax();
  }
  const long slice_us = static_cast<long>(config_.liveness_slice_ms * 1000);
  shm::SegmentHeader* me = own_.header();
  for (;;) {
    throw_if_unusable();
    // The shm rails' Dekker protocol (shm_ring.h): flag, doorbell, re-check, then sleep on that value.
    me->sleeping.store(1);
    const uint32_t bell = me->doorbell.load();
    const int lag = behind(counter, steps);
    if (lag < 0) {
      me->sleeping.store(0);
      return;
    }
    const long left_us = duration_cast<microseconds>(deadline.at() - Clock::now()).count();
    if (left_us > 0) shm::futex_wait(&me->doorbell, bell, std::min(slice_us, left_us));
    me->sleeping.store(0);
    if (behind(counter, steps) < 0) return;
    check_peers();
    if (deadline.expired())
      fail<TimeoutError>(lag, who() + ": timed out waiting for " + rank_name(lag) + " to " + phase);
  }
}

void CudaIpcLane::write_descriptor(uint64_t step, const Operation& what) {
  peers_[rank_].control->descriptors[step % config_.slots] = {
      step, what.seq, what.count, static_cast<uint32_t>(what.dtype), static_cast<uint32_t>(what.op),
      static_cast<uint32_t>(transport::CollectiveOp::kAllreduce), -1, 0};
}

void CudaIpcLane::check_descriptors(uint64_t step, const Operation& what) {
  for (int r = 0; r < size_; ++r) {
    const transport::shm_coll::SlotDescriptor& d = peers_[r].control->descriptors[step % config_.slots];
    if (d.step == step && d.seq == what.seq && d.count == what.count && d.dtype == static_cast<uint32_t>(what.dtype) &&
        d.op == static_cast<uint32_t>(what.op))
      continue;
    auto describe = [](uint64_t seq, uint64_t count, uint32_t dtype, uint32_t op) {
      return "allreduce #" + std::to_string(seq) + " of " + std::to_string(count) + " elements (" +
             (is_valid_dtype(static_cast<int>(dtype)) ? dtype_name(static_cast<DataType>(dtype)) : "dtype ?") + " with " +
             (is_valid_reduce_op(static_cast<int>(op)) ? reduce_op_name(static_cast<ReduceOp>(op)) : "op ?") + ")";
    };
    fail<ProtocolError>(-1, who() + ": " + rank_name(r) + " runs " + describe(d.seq, d.count, d.dtype, d.op) +
                                " where this rank runs " +
                                describe(what.seq, what.count, static_cast<uint32_t>(what.dtype),
                                         static_cast<uint32_t>(what.op)));
  }
}

void CudaIpcLane::allreduce(CudaDriver::DevicePtr input, CudaDriver::DevicePtr output, size_t count, DataType dtype,
                            ReduceOp op, CudaDriver::Stream stream, uint64_t seq, const Deadline& deadline,
                            double postscale) {
  if (!is_valid_dtype(static_cast<int>(dtype)) || !is_valid_reduce_op(static_cast<int>(op)))
    throw InvalidArgument(who() + ": allreduce of an unknown dtype or op code");
  const double scale = op == ReduceOp::kAverage ? postscale / size_ : postscale;
  if (dtype == DataType::kBool && scale != 1.0)
    throw InvalidArgument(who() + ": bool tensors cannot be averaged or scaled; use Sum/Min/Max");
  if (!is_floating(dtype) && !std::isfinite(scale))
    throw InvalidArgument(who() + std::string(": non-finite scale for integer dtype ") + dtype_name(dtype));
  if (count > 0 && (input == 0 || output == 0)) throw InvalidArgument(who() + ": allreduce of a null device pointer");
  check_startable();
  if (count == 0) return;
  const CudaDriver& cuda = CudaDriver::get();
  StreamContext in_context(cuda, stream);
  CudaDriver::Context current = nullptr;
  cuda.check(cuda.ctx_get_current(&current), "cuCtxGetCurrent");
  if (current != context_)
    throw InvalidArgument(who() + ": the stream belongs to another CUDA context than the lane's (connect's)");
  const size_t esize = dtype_size(dtype);
  const size_t chunk_elems = config_.chunk_bytes / esize;
  const Operation what{seq, count, dtype, op};
  for (size_t at = 0; at < count; at += chunk_elems)
    run_chunk(cuda, what, input + at * esize, output + at * esize, std::min(chunk_elems, count - at), scale, stream,
              deadline);
}

void CudaIpcLane::run_chunk(const CudaDriver& cuda, const Operation& what, CudaDriver::DevicePtr in,
                            CudaDriver::DevicePtr out, size_t elems, double scale, CudaDriver::Stream stream,
                            const Deadline& deadline) {
  const size_t esize = dtype_size(what.dtype);
  const uint64_t g = step_++;
  const bool whole = what.count * esize <= config_.small_bytes;
  // Copy in, once nobody still reads what the slot held `slots` chunks ago.
  if (g >= config_.slots) wait_all(Counter::kConsumed, g + 1 - config_.slots, counter_phase(Counter::kConsumed), deadline);
  write_descriptor(g, what);
  check_cuda(cuda, cuda.memcpy_dtod_async(slot(rank_, g), in, elems * esize, stream), "cuMemcpyDtoDAsync (copy in)");
  check_cuda(cuda, cuda.stream_synchronize(stream), "cuStreamSynchronize after the copy in");
  publish(Counter::kCopied, g + 1);
  if (config_.after_copy_in) config_.after_copy_in(g);
  wait_all(Counter::kCopied, g + 1, counter_phase(Counter::kCopied), deadline);
  check_descriptors(g, what);

  ReduceArgs args{};
  args.ranks = size_;
  args.scale = scale;
  if (whole) {  // every rank reduces the whole chunk straight into its output
    for (int r = 0; r < size_; ++r) args.srcs[r] = slot(r, g);
    args.dst = out;
    args.count = elems;
    args.vectorised = aligned16(out);
    launch(cuda, what, args, stream);
    check_cuda(cuda, cuda.stream_synchronize(stream), "cuStreamSynchronize after the reduction");
    publish(Counter::kConsumed, g + 1);
    return;
  }
  // This rank's slice, from every workspace in rank order, in place in its own slot.
  const size_t begin = slice_begin(elems, esize, size_, rank_);
  const size_t end = slice_begin(elems, esize, size_, rank_ + 1);
  bool aligned = true;
  for (int r = 0; r < size_; ++r) {
    args.srcs[r] = slot(r, g) + begin * esize;
    aligned &= aligned16(args.srcs[r]);
  }
  args.dst = slot(rank_, g) + begin * esize;
  args.count = end - begin;
  args.vectorised = aligned;
  launch(cuda, what, args, stream);
  check_cuda(cuda, cuda.stream_synchronize(stream), "cuStreamSynchronize after the reduction");
  publish(Counter::kReduced, g + 1);
  wait_all(Counter::kReduced, g + 1, counter_phase(Counter::kReduced), deadline);
  // Every rank's reduced slice out of its slot.
  for (int r = 0; r < size_; ++r) {
    const size_t b = slice_begin(elems, esize, size_, r), e = slice_begin(elems, esize, size_, r + 1);
    if (e > b)
      check_cuda(cuda, cuda.memcpy_dtod_async(out + b * esize, slot(r, g) + b * esize, (e - b) * esize, stream),
                 "cuMemcpyDtoDAsync (copy out of " + rank_name(r) + "'s slot)");
  }
  check_cuda(cuda, cuda.stream_synchronize(stream), "cuStreamSynchronize after the copy out");
  publish(Counter::kConsumed, g + 1);
}

}  // namespace nezha::cuda
