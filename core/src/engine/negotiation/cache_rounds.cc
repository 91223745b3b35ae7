#include "engine/negotiation/cache_rounds.h"

#include <algorithm>

#include "common/error.h"

namespace nezha::engine {
namespace {

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool contains(const std::vector<int32_t>& sorted, int32_t id) {
  return std::binary_search(sorted.begin(), sorted.end(), id);
}

}  // namespace

CacheRounds::CacheRounds(CacheRoundsOptions opt) : opt_(opt) {
  if (opt_.size < 2) opt_.enabled = false;
}

void CacheRounds::learn(int32_t id, const Request& own, const Response& resp, size_t index) {
  if (id < 0) return;
  auto old = by_name_.find(own.name);
  if (old != by_name_.end() && old->second != id) by_id_.erase(old->second);
  Entry e;
  e.name = own.name;
  e.own = own;
  e.own.cache_id = -1;
  e.round_eligible = own.type == OpType::kAllreduce && own.group.empty() &&
                     resp.type == OpType::kAllreduce && index < resp.counts.size();
  if (e.round_eligible) {
    e.count = resp.counts[index];
    e.dtype = resp.dtype;
    e.op = resp.op;
    e.prescale = resp.prescale;
    e.postscale = resp.postscale;
  }
  auto cur = by_id_.find(id);
  bool same = cur != by_id_.end() && cur->second.count == e.count && cur->second.dtype == e.dtype &&
              cur->second.op == e.op && cur->second.prescale == e.prescale &&
              cur->second.postscale == e.postscale && cur->second.round_eligible == e.round_eligible &&
              cur->second.name == e.name;
  if (!same) ++versions_[id];
  by_name_[own.name] = id;
  by_id_[id] = std::move(e);
}

CacheRounds::Decision CacheRounds::route(const Request& req) const {
  Decision d;
  auto it = by_name_.find(req.name);
  if (it == by_name_.end()) return d;
  const Entry& e = by_id_.at(it->second);
  d.id = it->second;
  d.version = versions_.at(d.id);
  if (!e.own.same_metadata(req)) {
    d.route = Route::kFull;
    d.invalidate = opt_.enabled && e.round_eligible;  // others may be waiting on a round for it
    return d;
  }
  d.route = opt_.enabled && e.round_eligible ? Route::kRound : Route::kBrief;
  return d;
}

void CacheRounds::add_pending(int32_t id, Clock::time_point now) {
  Pending p;
  p.since = now;
  pending_[id] = p;
  changed_ = true;
}

void CacheRounds::announce_invalidation(int32_t id, uint32_t version) {
  invalidations_[id] = version;
  changed_ = true;
}

void CacheRounds::forget_pending(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) pending_.erase(it->second);
}

void CacheRounds::set_joined() {
  join_gen_ = joins_completed_ + 1;
  changed_ = true;
}

void CacheRounds::join_completed() {
  ++joins_completed_;
  join_gen_ = 0;
}

bool CacheRounds::join_may_complete() const {
  return !opt_.enabled || all_joined_gen_ == joins_completed_ + 1;
}

bool CacheRounds::round_due() const {
  return opt_.enabled && started_ == completed_ && (changed_ || inbox_.count(completed_ + 1));
}

RoundMessage CacheRounds::start_round(Clock::time_point now,
                                      std::vector<multirail::RailEstimate> estimates) {
  RoundMessage msg;
  msg.round = ++started_;
  msg.join_gen = join_gen_;
  for (const auto& [id, p] : pending_) msg.pending.push_back(id);
  for (const auto& [id, version] : invalidations_) {
    msg.invalidate.push_back(id);
    msg.invalidate_versions.push_back(version);
  }
  if (opt_.rank == 0) msg.estimates = std::move(estimates);
  invalidations_.clear();
  changed_ = false;
  round_started_at_ = now;
  auto& slot = inbox_[started_];
  slot.resize(opt_.size);
  slot[opt_.rank] = msg;
  return msg;
}

void CacheRounds::receive(int peer, RoundMessage msg) {
  if (!opt_.enabled)
    throw ProtocolError("rank " + std::to_string(peer) + " sent a cache round, but rank " +
                        std::to_string(opt_.rank) + " has them off (NEZHA_CACHE_ROUNDS differs?)");
  if (peer < 0 || peer >= opt_.size || peer == opt_.rank)
    throw ProtocolError("cache round from invalid rank " + std::to_string(peer));
  // A peer can be at most one round ahead of the last round this rank has sent its vector for:
  // it cannot complete a round without that vector.
  bool next = msg.round == completed_ + 1;
  bool after_next = msg.round == completed_ + 2 && started_ == completed_ + 1;
  if (!next && !after_next)
    throw ProtocolError("rank " + std::to_string(peer) + " sent cache round " +
                        std::to_string(msg.round) + " while rank " + std::to_string(opt_.rank) +
                        " has completed round " + std::to_string(completed_));
  auto& slot = inbox_[msg.round];
  slot.resize(opt_.size);
  if (slot[peer])
    throw ProtocolError("rank " + std::to_string(peer) + " sent cache round " +
                        std::to_string(msg.round) + " twice");
  slot[peer] = std::move(msg);
}

void CacheRounds::hold(ResponseList list) { held_.push_back(std::move(list)); }

std::optional<RoundStep> CacheRounds::next() {
  if (!held_.empty() && held_.front().round <= completed_) {
    RoundStep s;
    s.responses = std::move(held_.front());
    held_.pop_front();
    return s;
  }
  if (started_ != completed_ + 1) return std::nullopt;
  auto it = inbox_.find(started_);
  if (it == inbox_.end() ||
      !std::all_of(it->second.begin(), it->second.end(), [](const auto& m) { return m.has_value(); }))
    return std::nullopt;
  RoundStep s;
  s.round = complete_round();
  return s;
}

RoundOutcome CacheRounds::complete_round() {
  const uint64_t round = completed_ + 1;
  std::vector<RoundMessage> msgs;
  for (auto& m : inbox_[round]) msgs.push_back(std::move(*m));
  inbox_.erase(round);
  completed_ = round;

  RoundOutcome out;
  out.round = round;
  out.estimates = msgs[0].estimates;
  // A join generation is valid only while that join is still in flight at this point of the total
  // order (joins_completed_ is the same on every rank here).
  std::vector<bool> joined(opt_.size);
  bool all_joined = true;
  for (int r = 0; r < opt_.size; ++r) {
    joined[r] = msgs[r].join_gen != 0 && msgs[r].join_gen == joins_completed_ + 1;
    all_joined = all_joined && joined[r];
  }
  if (all_joined) all_joined_gen_ = joins_completed_ + 1;

  // Invalidations first: an invalidated id never runs in the round that announces it.
  std::set<int32_t> invalid;
  for (const auto& m : msgs)
    for (size_t i = 0; i < m.invalidate.size(); ++i) {
      auto v = versions_.find(m.invalidate[i]);
      if (v != versions_.end() && v->second == m.invalidate_versions[i]) invalid.insert(m.invalidate[i]);
    }
  for (int32_t id : invalid) {
    auto e = by_id_.find(id);
    if (e == by_id_.end()) continue;  // already erased by an earlier announcement
    if (pending_.erase(id)) out.requeue.push_back(e->second.name);
    by_name_.erase(e->second.name);
    by_id_.erase(e);
  }

  std::set<int32_t> candidates;
  for (const auto& m : msgs) candidates.insert(m.pending.begin(), m.pending.end());
  std::vector<int32_t> ready;
  for (int32_t id : candidates) {
    if (invalid.count(id)) continue;
    std::vector<int> missing;
    for (int r = 0; r < opt_.size; ++r)
      if (!joined[r] && !contains(msgs[r].pending, id)) missing.push_back(r);
    if (missing.empty()) {
      auto e = by_id_.find(id);
      if (e == by_id_.end() || !e->second.round_eligible)
        throw ProtocolError("cache round " + std::to_string(round) + ": cache id " +
                            std::to_string(id) + " is not a cached allreduce on rank " +
                            std::to_string(opt_.rank));
      ready.push_back(id);
      pending_.erase(id);
    } else if (auto p = pending_.find(id); p != pending_.end()) {
      p->second.missing = std::move(missing);
    }
  }
  out.ops = fuse(ready, out.estimates);
  return out;
}

std::vector<Response> CacheRounds::fuse(const std::vector<int32_t>& ids,
                                        const std::vector<multirail::RailEstimate>& estimates) const {
  // Mirrors Coordinator::fuse: consecutive allreduces of the same dtype/op/scales up to the
  // fusion threshold; a tensor larger than the threshold, or of at least unfused_bytes (as the
  // rails scale it), runs alone.
  const size_t unfused_bytes = scaled_unfused_bytes(opt_.unfused_bytes, estimates);
  std::vector<Response> out;
  size_t out_bytes = 0;
  bool last_alone = false;
  for (int32_t id : ids) {
    const Entry& e = by_id_.at(id);
    size_t bytes = static_cast<size_t>(e.count) * dtype_size(e.dtype);
    const bool alone = runs_unfused(bytes, unfused_bytes);
    if (!alone && !last_alone && !out.empty()) {
      Response& last = out.back();
      if (last.dtype == e.dtype && last.op == e.op && last.prescale == e.prescale &&
          last.postscale == e.postscale && out_bytes + bytes <= opt_.fusion_threshold) {
        last.names.push_back(e.name);
        last.counts.push_back(e.count);
        last.cache_ids.push_back(id);
        out_bytes += bytes;
        continue;
      }
    }
    Response r;
    r.kind = Response::Kind::kExecute;
    r.type = OpType::kAllreduce;
    r.names = {e.name};
    r.counts = {e.count};
    r.dtype = e.dtype;
    r.op = e.op;
    r.prescale = e.prescale;
    r.postscale = e.postscale;
    r.cache_ids = {id};
    out.push_back(std::move(r));
    out_bytes = bytes;
    last_alone = alone;
  }
  return out;
}

std::optional<Clock::time_point> CacheRounds::next_wakeup(double timeout_s, double stall_check_s) const {
  std::optional<Clock::time_point> t;
  auto earlier = [&](Clock::time_point c) { if (!t || c < *t) t = c; };
  if (started_ > completed_) earlier(round_started_at_ + seconds(timeout_s));
  if (stall_check_s > 0)
    for (const auto& [id, p] : pending_)
      if (!p.warned) earlier(p.since + seconds(stall_check_s));
  return t;
}

std::vector<int> CacheRounds::late_ranks(Clock::time_point now, double timeout_s) const {
  std::vector<int> late;
  if (started_ <= completed_ || now - round_started_at_ < seconds(timeout_s)) return late;
  auto it = inbox_.find(started_);
  for (int r = 0; r < opt_.size; ++r)
    if (it == inbox_.end() || !it->second[r]) late.push_back(r);
  return late;
}

std::vector<RoundStall> CacheRounds::check_stalls(Clock::time_point now, double stall_check_s) {
  std::vector<RoundStall> out;
  if (stall_check_s <= 0) return out;
  for (auto& [id, p] : pending_) {
    if (p.warned || now - p.since < seconds(stall_check_s)) continue;
    p.warned = true;
    RoundStall s;
    auto e = by_id_.find(id);
    s.name = e == by_id_.end() ? "cache id " + std::to_string(id) : e->second.name;
    s.age_s = std::chrono::duration<double>(now - p.since).count();
    s.missing_ranks = p.missing;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace nezha::engine
