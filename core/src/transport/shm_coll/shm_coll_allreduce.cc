// An allreduce on a ShmCollRail, on the chunk pipeline (shm_coll_pipeline.h). Small ones (at most
// small_bytes) in two phases: every rank places its chunk, then reduces the whole chunk from all
// slots into its output. Larger ones in three: place; each rank reduces its slice of the chunk in
// place in its own slot (middle); each copies every rank's reduced slice out. Either way in rank
// order, so every rank gets the same bits.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "transport/shm_coll/shm_coll_pipeline.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {

class ShmCollRail::Request final : public Pipeline {
 public:
  Request(ShmCollRail& rail, const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
          uint64_t seq, OverwriteHook hook)
      : Pipeline(rail, identity(seq, count, dtype, op), chunks_of(rail, count, dtype),
                 /*has_middle=*/count * dtype_size(dtype) > rail.config_.small_bytes),
        in_(static_cast<const uint8_t*>(input)), out_(static_cast<uint8_t*>(output)), count_(count),
        dtype_(dtype), op_(op), hook_(std::move(hook)), esize_(dtype_size(dtype)),
        chunk_elems_(rail.config_.chunk_bytes / esize_), small_(count * esize_ <= rail.config_.small_bytes),
        srcs_(static_cast<size_t>(rail.size_)) {}

 private:
  static OpIdentity identity(uint64_t seq, size_t count, DataType dtype, ReduceOp op) {
    OpIdentity what;
    what.kind = CollectiveOp::kAllreduce;
    what.seq = seq;
    what.count = count;
    what.dtype = dtype;
    what.op = op;
    return what;
  }
  static uint64_t chunks_of(const ShmCollRail& rail, size_t count, DataType dtype) {
    const size_t per = rail.config_.chunk_bytes / dtype_size(dtype);
    return count == 0 ? 0 : (count + per - 1) / per;
  }
  size_t chunk_count(uint64_t k) const { return std::min(chunk_elems_, count_ - k * chunk_elems_); }
  // Rank r's slice of a chunk of n elements, in elements: whole cache lines, the last ones may be short
  // or empty (sizes not divisible by the ranks).
  std::pair<size_t, size_t> slice(size_t n, int r) const {
    const size_t line = 64 / esize_;
    const size_t per = ((n + ranks() - 1) / ranks() + line - 1) / line * line;
    const size_t begin = std::min(n, per * static_cast<size_t>(r));
    return {begin, std::min(n, begin + per) - begin};
  }
  const std::vector<const uint8_t*>& sources(uint64_t k) {
    for (int r = 0; r < ranks(); ++r) srcs_[r] = slot(r, k);
    return srcs_;
  }

  size_t place(uint64_t k, uint8_t* own_slot) override {
    const size_t bytes = chunk_count(k) * esize_;
    copy(own_slot, in_ + k * chunk_elems_ * esize_, bytes);
    return bytes;
  }

  // This rank's slice of chunk k, reduced in place in its own slot (peers read only other slices of
  // it, and only after it publishes `reduced`).
  void middle(uint64_t k) override {
    const auto [begin, n] = slice(chunk_count(k), rank());
    uint8_t* dst = slot(rank(), k) + begin * esize_;
    const auto& srcs = sources(k);
    split(n * esize_, [&](size_t at, size_t len) {
      shm_coll::reduce_sources(dst + at, srcs, begin * esize_ + at, len, esize_, dtype_, op_, config().reduce_into);
    });
  }

  size_t take(uint64_t k) override {
    const size_t n = chunk_count(k), offset = k * chunk_elems_ * esize_;
    if (hook_) hook_(offset, n * esize_);
    if (small_) {
      const auto& srcs = sources(k);
      split(n * esize_, [&](size_t at, size_t len) {
        shm_coll::reduce_sources(out_ + offset + at, srcs, at, len, esize_, dtype_, op_, config().reduce_into);
      });
    } else {
      // Every rank's reduced slice, from its slot: bytes [at, at + len) of the chunk span the slices
      // of the ranks that own them.
      split(n * esize_, [&](size_t at, size_t len) {
        for (int r = 0; r < ranks(); ++r) {
          const auto [begin, count] = slice(n, r);
          const size_t from = std::max(at, begin * esize_), to = std::min(at + len, (begin + count) * esize_);
          if (from < to) std::memcpy(out_ + offset + from, slot(r, k) + from, to - from);
        }
      });
    }
    return n * esize_;
  }

  const uint8_t* in_;
  uint8_t* out_;
  const size_t count_;
  const DataType dtype_;
  const ReduceOp op_;
  OverwriteHook hook_;
  const size_t esize_, chunk_elems_;
  const bool small_;
  std::vector<const uint8_t*> srcs_;
};

std::unique_ptr<CollectiveRequest> ShmCollRail::start_allreduce(const void* input, void* output, size_t count,
                                                                 DataType dtype, ReduceOp op, uint64_t seq,
                                                                 OverwriteHook before_overwrite) {
  if (!reduces(dtype, op))
    throw InvalidArgument(who() + " does not reduce " + dtype_name(dtype) + " with " + reduce_op_name(op) +
                          (config_.reduce_into ? "" : " (no reduction kernel was given)"));
  check_startable();
  return std::make_unique<Request>(*this, input, output, count, dtype, op, seq, std::move(before_overwrite));
}

}  // namespace nezha::transport
