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

ShmCollRail::Pipeline::Pipeline(ShmCollRail& rail, const OpIdentity& what, uint64_t chunks)
    : rail_(rail), what_(what), chunks_(chunks), base_(rail.step_) {
  rail.step_ += chunks;  // every rank runs the same operations: the step numbers agree
}

int ShmCollRail::Pipeline::place_blocker() const {
  if (next_place_ >= chunks_) return -2;
  const uint64_t g = base_ + next_place_;
  const uint32_t slots = rail_.config_.slots;
  if (g < slots) return -1;
  for (int r = 0; r < rail_.size_; ++r)
    if (rail_.peers_[r].ws.control->consumed.steps.load(std::memory_order_seq_cst) < g + 1 - slots) return r;
  return -1;
}

int ShmCollRail::Pipeline::take_blocker() const {
  if (next_take_ >= next_place_) return -2;
  const uint64_t g = base_ + next_take_;
  for (int r = 0; r < rail_.size_; ++r)
    if (rail_.peers_[r].ws.control->copied.steps.load(std::memory_order_seq_cst) < g + 1) return r;
  return -1;
}

int ShmCollRail::Pipeline::blocker() {
  const int take = take_blocker(), place = place_blocker();
  if (take == -1 || place == -1) return -1;
  if (take >= 0) {
    phase_ = "place its part of the step";
    return take;
  }
  phase_ = "finish reading an earlier step";
  return place;
}

bool ShmCollRail::Pipeline::progress(const Deadline* deadline) {
  if (done()) return true;
  rail_.throw_if_unusable();
  shm_coll::Workspace& me = rail_.peers_[rail_.rank_].ws;
  for (;;) {
    if (place_blocker() == -1) {
      // Place first: the peers wait for it.
      const uint64_t k = next_place_++, g = base_ + k;
      rail_.write_descriptor(g, what_);
      rail_.bytes_sent_ += place(k, me.slot(g));
      me.control->copied.steps.store(g + 1, std::memory_order_seq_cst);
      rail_.notify_peers();
    } else if (take_blocker() == -1) {
      const uint64_t k = next_take_++, g = base_ + k;
      rail_.check_descriptors(g, what_);
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
