#include "transport/shm_coll/shm_coll_pipeline.h"

#include <cstring>

namespace nezha::transport {

void shm_coll::reduce_sources(uint8_t* dst, const std::vector<const uint8_t*>& srcs, size_t offset, size_t bytes,
                              size_t elem_size, DataType dtype, ReduceOp op, ReduceKernel kernel) {
  constexpr size_t kBlock = 8 << 10;  // a multiple of every element size
  alignas(64) uint8_t acc[kBlock];
  for (size_t at = 0; at < bytes; at += kBlock) {
    const size_t len = std::min(kBlock, bytes - at);
    std::memcpy(acc, srcs[0] + offset + at, len);
    for (size_t i = 1; i < srcs.size(); ++i) kernel(acc, srcs[i] + offset + at, len / elem_size, dtype, op);
    std::memcpy(dst + at, acc, len);
  }
}

ShmCollRail::Pipeline::Pipeline(ShmCollRail& rail, const OpIdentity& what, uint64_t chunks, bool has_middle)
    : rail_(rail), what_(what), chunks_(chunks), base_(rail.step_), has_middle_(has_middle) {
  rail.step_ += chunks;  // every rank runs the same operations: the step numbers agree
}

int ShmCollRail::Pipeline::behind(shm_coll::StepCounter shm_coll::WorkspaceControl::*counter, uint64_t steps) const {
  for (int r = 0; r < rail_.size_; ++r)
    if ((rail_.peers_[r].ws.control->*counter).steps.load(std::memory_order_seq_cst) < steps) return r;
  return -1;
}

int ShmCollRail::Pipeline::place_blocker() const {
  if (next_place_ >= chunks_) return -2;
  const uint64_t g = base_ + next_place_;
  const uint32_t slots = rail_.config_.slots;
  return g < slots ? -1 : behind(&shm_coll::WorkspaceControl::consumed, g + 1 - slots);
}

int ShmCollRail::Pipeline::middle_blocker() const {
  if (!has_middle_ || next_middle_ >= next_place_) return -2;
  return behind(&shm_coll::WorkspaceControl::copied, base_ + next_middle_ + 1);
}

int ShmCollRail::Pipeline::take_blocker() const {
  if (next_take_ >= (has_middle_ ? next_middle_ : next_place_)) return -2;
  return behind(has_middle_ ? &shm_coll::WorkspaceControl::reduced : &shm_coll::WorkspaceControl::copied,
                base_ + next_take_ + 1);
}

int ShmCollRail::Pipeline::blocker() {
  const int take = take_blocker(), middle = middle_blocker(), place = place_blocker();
  if (take == -1 || middle == -1 || place == -1) return -1;
  if (take >= 0) {
    phase_ = has_middle_ ? "reduce its slice" : "place its part of the step";
    return take;
  }
  if (middle >= 0) {
    phase_ = "place its part of the step";
    return middle;
  }
  phase_ = "finish reading an earlier step";
  return place;
}

bool ShmCollRail::Pipeline::progress(const Deadline* deadline) {
  if (done()) return true;
  rail_.throw_if_unusable();
  shm_coll::Workspace& me = rail_.peers_[rail_.rank_].ws;
  for (;;) {
    // The middle phase first, then placing: the peers wait on both.
    if (middle_blocker() == -1) {
      const uint64_t k = next_middle_++, g = base_ + k;
      rail_.check_descriptors(g, what_);
      middle(k);
      me.control->reduced.steps.store(g + 1, std::memory_order_seq_cst);
      rail_.notify_peers();
    } else if (place_blocker() == -1) {
      const uint64_t k = next_place_++, g = base_ + k;
      rail_.write_descriptor(g, what_);
      rail_.bytes_sent_ += place(k, me.slot(g));
      me.control->copied.steps.store(g + 1, std::memory_order_seq_cst);
      rail_.notify_peers();
    } else if (take_blocker() == -1) {
      const uint64_t k = next_take_++, g = base_ + k;
      if (!has_middle_) rail_.check_descriptors(g, what_);
      rail_.bytes_received_ += take(k);
      me.control->consumed.steps.store(g + 1, std::memory_order_seq_cst);
      rail_.notify_peers();
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

}  // namespace nezha::transport
