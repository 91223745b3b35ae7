// One allreduce on a ShmCollRail: the three-phase chunk pipeline (shm_coll_rail.h) as a state
// machine that does whatever step is ready (reduce first: peers wait on it; then copy-in; then
// copy-out) and sleeps only when none is.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm_coll/shm_coll_pipeline.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {


class ShmCollRail::Request final : public CollectiveRequest {
 public:
  Request(ShmCollRail& rail, const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
          uint64_t seq, OverwriteHook hook)
      : rail_(rail), in_(static_cast<const uint8_t*>(input)), out_(static_cast<uint8_t*>(output)),
        count_(count), dtype_(dtype), op_(op), seq_(seq), hook_(std::move(hook)),
        esize_(dtype_size(dtype)), chunk_elems_(rail.config_.chunk_bytes / esize_),
        chunks_(count == 0 ? 0 : (count + chunk_elems_ - 1) / chunk_elems_),
        small_(count * esize_ <= rail.config_.small_bytes), base_(rail.step_),
        srcs_(static_cast<size_t>(rail.size_)) {
    what_.kind = CollectiveOp::kAllreduce;
    what_.seq = seq;
    what_.count = count;
    what_.dtype = dtype;
    what_.op = op;
    rail.step_ += chunks_;  // every rank runs the same allreduces: the step numbers agree
  }

  bool test() override { return progress(nullptr); }
  void wait(const Deadline& deadline) override { progress(&deadline); }

 private:
  using Workspace = shm_coll::Workspace;

  size_t chunk_count(uint64_t k) const { return std::min(chunk_elems_, count_ - k * chunk_elems_); }
  // Rank r's slice of a chunk of n elements, in elements: whole cache lines, the last ones may be short
  // or empty (sizes not divisible by the ranks).
  std::pair<size_t, size_t> slice(size_t n, int r) const {
    const size_t line = 64 / esize_;
    const size_t ranks = static_cast<size_t>(rail_.size_);
    const size_t per = ((n + ranks - 1) / ranks + line - 1) / line * line;
    const size_t begin = std::min(n, per * static_cast<size_t>(r));
    return {begin, std::min(n, begin + per) - begin};
  }
  Workspace& ws(int r) const { return rail_.peers_[r].ws; }
  // The first rank whose counter is below `steps`; -1 if none.
  int behind(shm_coll::StepCounter shm_coll::WorkspaceControl::*counter, uint64_t steps) const {
    for (int r = 0; r < rail_.size_; ++r)
      if ((ws(r).control->*counter).steps.load(std::memory_order_seq_cst) < steps) return r;
    return -1;
  }

  // Rank behind for each step that may come next (-1: that step is ready; -2: nothing to do there).
  int in_blocker() const {
    if (next_in_ >= chunks_) return -2;
    const uint64_t g = base_ + next_in_;
    return g < ws(0).slots ? -1 : behind(&shm_coll::WorkspaceControl::consumed, g + 1 - ws(0).slots);
  }
  int reduce_blocker() const {
    if (next_red_ >= next_in_) return -2;
    return behind(&shm_coll::WorkspaceControl::copied, base_ + next_red_ + 1);
  }
  int out_blocker() const {
    if (next_out_ >= (small_ ? next_in_ : next_red_)) return -2;
    return behind(small_ ? &shm_coll::WorkspaceControl::copied : &shm_coll::WorkspaceControl::reduced,
                  base_ + next_out_ + 1);
  }

  void copy_in() {
    const uint64_t k = next_in_++, g = base_ + k;
    const size_t n = chunk_count(k);
    Workspace& me = ws(rail_.rank_);
    rail_.write_descriptor(g, what_);
    std::memcpy(me.slot(g), in_ + k * chunk_elems_ * esize_, n * esize_);
    me.control->copied.steps.store(g + 1, std::memory_order_seq_cst);
    rail_.bytes_sent_ += n * esize_;
    rail_.notify_peers();
  }

  // Every rank's chunk g must belong to the same allreduce as ours.
  void check_descriptors(uint64_t g) { rail_.check_descriptors(g, what_); }

  const std::vector<const uint8_t*>& sources(uint64_t g) {
    for (int r = 0; r < rail_.size_; ++r) srcs_[r] = ws(r).slot(g);
    return srcs_;
  }

  // This rank's slice of chunk k, reduced in place in its own slot (peers read only other slices
  // of it, and only after it publishes `reduced`).
  void reduce() {
    const uint64_t k = next_red_++, g = base_ + k;
    check_descriptors(g);
    const auto [begin, n] = slice(chunk_count(k), rail_.rank_);
    Workspace& me = ws(rail_.rank_);
    shm_coll::reduce_sources(me.slot(g) + begin * esize_, sources(g), begin * esize_, n * esize_, esize_, dtype_,
                             op_, rail_.config_.reduce_into);
    me.control->reduced.steps.store(g + 1, std::memory_order_seq_cst);
    rail_.notify_peers();
  }

  void copy_out() {
    const uint64_t k = next_out_++, g = base_ + k;
    const size_t n = chunk_count(k), offset = k * chunk_elems_ * esize_;
    if (hook_) hook_(offset, n * esize_);
    if (small_) {
      check_descriptors(g);
      shm_coll::reduce_sources(out_ + offset, sources(g), 0, n * esize_, esize_, dtype_, op_,
                               rail_.config_.reduce_into);
    } else {
      for (int r = 0; r < rail_.size_; ++r) {
        const auto [begin, len] = slice(n, r);
        std::memcpy(out_ + offset + begin * esize_, ws(r).slot(g) + begin * esize_, len * esize_);
      }
    }
    ws(rail_.rank_).control->consumed.steps.store(g + 1, std::memory_order_seq_cst);
    rail_.bytes_received_ += n * esize_;
    rail_.notify_peers();
  }

  // Runs every ready step; blocks (deadline given) until all are done, or returns whether they are.
  bool progress(const Deadline* deadline) {
    if (done()) return true;
    rail_.throw_if_unusable();
    for (;;) {
      if (!small_ && reduce_blocker() == -1) {
        reduce();
      } else if (in_blocker() == -1) {
        copy_in();
      } else if (out_blocker() == -1) {
        copy_out();
      } else if (done()) {
        return true;
      } else if (!deadline) {
        return false;
      } else {
        rail_.wait_until([this] { return blocker(); }, &phase_, *deadline);
      }
      if (done()) return true;
    }
  }

  bool done() const { return next_out_ == chunks_; }

  // -1 when some step is ready; else the rank holding back the step due first (and phase_ says which).
  int blocker() {
    const int out = out_blocker(), red = small_ ? -2 : reduce_blocker(), in = in_blocker();
    if (out == -1 || red == -1 || in == -1) return -1;
    if (out >= 0) {
      phase_ = small_ ? "copy its input in" : "reduce its slice";
      return out;
    }
    if (red >= 0) {
      phase_ = "copy its input in";
      return red;
    }
    phase_ = "finish reading an earlier chunk";
    return in;
  }

  ShmCollRail& rail_;
  const uint8_t* in_;
  uint8_t* out_;
  const size_t count_;
  const DataType dtype_;
  const ReduceOp op_;
  const uint64_t seq_;
  OverwriteHook hook_;
  const size_t esize_, chunk_elems_;
  const uint64_t chunks_;
  const bool small_;
  const uint64_t base_;
  uint64_t next_in_ = 0, next_red_ = 0, next_out_ = 0;
  std::vector<const uint8_t*> srcs_;
  const char* phase_ = "";
  OpIdentity what_;
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
