#include "engine/negotiation/host_vote.h"

#include "engine/negotiation/control_inline.h"

namespace nezha::engine {

void HostVote::learn(const Request& own, const Response& resp, size_t index) {
  if (resp.kind != Response::Kind::kExecute || resp.type != OpType::kAllreduce || resp.process_set != 0 ||
      index >= resp.counts.size() || !board_.ready())
    return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(own.name);
  if (it == by_name_.end()) {
    // Seen once: no slot yet. Names used once (a sequence number in each) would take every slot.
    by_name_.emplace(own.name, Slotted{});
    return;
  }
  const size_t bytes = static_cast<size_t>(resp.counts[index]) * dtype_size(resp.dtype);
  const bool fits = resp.counts[index] > 0 && bytes <= HostVoteBoard::kMaxInputBytes;
  if (it->second.slot == kNoSlot) {
    // Only tensors that fit take one: a model's gradients, repeated from the second step on, would
    // otherwise take every slot before the loss or a metric is reduced the second time.
    if (!fits || slots_used_ >= HostVoteBoard::kSlots) return;
    it->second.slot = slots_used_++;
  }
  // What decides `votes` comes from the response, the same on every rank; `own` only says what this
  // rank's later submissions are compared with.
  Slotted& s = it->second;
  s.own = own;
  s.own.cache_id = -1;
  s.own.inline_input.clear();
  s.count = resp.counts[index];
  s.dtype = resp.dtype;
  s.op = resp.op;
  s.prescale = resp.prescale;
  s.postscale = effective_postscale(resp, size_);
  s.votes = fits;
}

std::vector<HostVote::Step> HostVote::plan(const std::vector<TensorEntry>& entries, bool lone_waiting_caller) const {
  std::vector<Step> steps(entries.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (by_name_.empty()) return steps;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Request& req = entries[i].req;
    auto it = by_name_.find(req.name);
    if (it == by_name_.end() || it->second.slot == kNoSlot) continue;
    const Slotted& s = it->second;
    Step& step = steps[i];
    step.slot = s.slot;
    const bool votes = lone_waiting_caller && entries.size() == 1 && s.votes && req.device == Device::kCpu &&
                       req.same_metadata(s.own) && req.bytes() == static_cast<size_t>(s.count) * dtype_size(s.dtype);
    step.kind = votes ? Step::Kind::kVote : Step::Kind::kDivert;
    step.count = s.count;
    step.dtype = s.dtype;
    step.op = s.op;
    step.prescale = s.prescale;
    step.postscale = s.postscale;
  }
  return steps;
}

void HostVote::commit(std::vector<Step>& steps) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Step& s : steps)
    if (s.kind != Step::Kind::kNone) s.seq = next_seq_[s.slot]++;
}

}  // namespace nezha::engine
