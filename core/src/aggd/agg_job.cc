#include "aggd/agg_job.h"

#include <cstring>

#include "collectives/reduce.h"
#include "common/error.h"

namespace nezha::aggd {

using transport::agg::AggType;
using transport::agg::kAggHeaderBytes;

AggJob::AggJob(uint64_t id, uint64_t epoch, const AggJoin& shape) : id_(id), epoch_(epoch), shape_(shape) {}

size_t AggJob::reserved_bytes(const AggJoin& s) {
  // window open slots of `size` parts each, plus window kept results and window being built.
  return static_cast<size_t>(s.window) * (s.size + 2) * (s.chunk_bytes + kAggHeaderBytes);
}

AggJob::Contribution AggJob::contribute(const AggHeader& h, const uint8_t* payload) {
  transport::agg::check_chunk_shape(h, shape_.size, shape_.chunk_bytes);
  const Key key{h.seq, h.chunk};
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    for (const auto& [k, frame] : kept_)
      if (k == key) return {Outcome::kResend, frame};
    if (any_completed_ && key < completed_upto_) return {Outcome::kStale, nullptr};
    if (slots_.size() >= shape_.window)
      throw ProtocolError("rank " + std::to_string(h.rank) + " opened more than " +
                          std::to_string(shape_.window) + " chunks at once (window exceeded)");
    Slot slot;
    slot.first = h;
    slot.parts.resize(shape_.size);
    it = slots_.emplace(key, std::move(slot)).first;
  }
  Slot& slot = it->second;
  const AggHeader& f = slot.first;
  if (h.count != f.count || h.dtype != f.dtype || h.op != f.op)
    throw ProtocolError("allreduce " + std::to_string(h.seq) + ": rank " + std::to_string(h.rank) +
                        " sent " + std::to_string(h.count) + " x " + dtype_name(h.dtype) + " (" +
                        reduce_op_name(h.op) + ") where rank " + std::to_string(f.rank) + " sent " +
                        std::to_string(f.count) + " x " + dtype_name(f.dtype) + " (" +
                        reduce_op_name(f.op) + ")");
  std::string& part = slot.parts[h.rank];
  if (!part.empty()) return {};  // a retransmission: this rank's bytes are in already
  part.assign(reinterpret_cast<const char*>(payload), h.length);
  if (h.length == 0) part.assign(1, '\0');  // marks an empty chunk as present
  if (++slot.have < shape_.size) return {};
  auto result = finish(key, slot);
  slots_.erase(it);
  return {Outcome::kCompleted, result};
}

std::shared_ptr<const std::string> AggJob::finish(const Key& key, Slot& slot) {
  AggHeader out = slot.first;
  out.type = AggType::kResult;
  out.rank = 0;
  out.job = id_;
  auto frame = std::make_shared<std::string>(transport::agg::encode_agg_header(out));
  const size_t len = slot.first.length;
  frame->append(slot.parts[0].data(), len);  // rank 0's bytes, then ranks 1.. n-1 in order
  uint8_t* acc = reinterpret_cast<uint8_t*>(frame->data()) + kAggHeaderBytes;
  const size_t elems = len / dtype_size(out.dtype);
  for (uint32_t r = 1; r < shape_.size; ++r)
    collectives::reduce_into(acc, slot.parts[r].data(), elems, out.dtype, out.op);
  kept_.emplace_back(key, frame);
  if (kept_.size() > shape_.window) kept_.pop_front();
  if (!any_completed_ || completed_upto_ < key) completed_upto_ = key;
  any_completed_ = true;
  return frame;
}

}  // namespace nezha::aggd
