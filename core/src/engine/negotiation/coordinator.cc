#include "engine/negotiation/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "engine/negotiation/control_inline.h"
#include "engine/negotiation/fusion.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {
namespace {

std::string shape_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
  return os.str();
}

// Groups ranks by the value of one field; a mismatch message lists each value with its ranks.
template <typename F>
std::optional<std::string> check_field(const std::string& tensor, const char* field,
                                       const std::vector<std::optional<Request>>& by_rank, F value) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    if (!by_rank[r]) continue;
    std::string v = value(*by_rank[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {r}});
    else it->second.push_back(r);
  }
  if (groups.size() <= 1) return std::nullopt;
  std::ostringstream os;
  os << "tensor '" << tensor << "': mismatched " << field << " across ranks: ";
  for (size_t i = 0; i < groups.size(); ++i)
    os << (i ? "; " : "") << groups[i].first << " on " << ranks_str(groups[i].second);
  return os.str();
}

bool is_reduction(OpType t) { return t == OpType::kAllreduce || t == OpType::kReducescatter; }

}  // namespace

Coordinator::Coordinator(CoordinatorOptions opt)
    : opt_(opt), unfused_bytes_(opt.unfused_bytes), joined_(opt.size, false) {}

void Coordinator::set_rail_estimates(const std::vector<multirail::RailEstimate>& estimates) {
  unfused_bytes_ = scaled_unfused_bytes(opt_.unfused_bytes, estimates);
}

void Coordinator::submit(int rank, std::vector<Request> requests, Clock::time_point now) {
  for (auto& req : requests) {
    bool cached = req.cache_id >= 0;
    if (cached) {
      if (req.cache_id >= static_cast<int32_t>(cache_.size()) ||
          cache_[req.cache_id][rank].name != req.name)
        throw ProtocolError("rank " + std::to_string(rank) + " sent unknown cache id " +
                            std::to_string(req.cache_id) + " for tensor '" + req.name + "'");
      std::string input = std::move(req.inline_input);  // travels with the brief request
      req = cache_[req.cache_id][rank];
      req.inline_input = std::move(input);
    }
    if (req.type == OpType::kJoin) {
      add_join(rank);
      continue;
    }
    if (!req.group.empty() && failed_groups_.count(req.group)) {
      FailedGroup& g = failed_groups_[req.group];
      if (g.owed[rank] > 0 && !pending_.count(req.name)) {
        --g.owed[rank];
        Response r;
        r.kind = Response::Kind::kError;
        r.type = req.type;
        r.names = {req.name};
        r.cache_ids = {-1};
        r.error = g.error;
        failed_.push_back(std::move(r));
        if (std::all_of(g.owed.begin(), g.owed.end(), [](int32_t n) { return n <= 0; }))
          failed_groups_.erase(req.group);
        continue;
      }
    }
    std::shared_ptr<const std::vector<int>> members;
    if (req.process_set != 0) {
      members = opt_.process_sets ? opt_.process_sets->members(req.process_set) : nullptr;
      if (!members) {
        fail_request(req, "tensor '" + req.name + "': process set " + std::to_string(req.process_set) +
                              " is not registered on rank 0 (add_process_set must be called on every rank)");
        continue;
      }
      if (!std::binary_search(members->begin(), members->end(), rank)) {
        fail_request(req, "tensor '" + req.name + "': rank " + std::to_string(rank) + " is not in process set " +
                              std::to_string(req.process_set) + " (" + members_str(*members) + ")");
        continue;
      }
    }
    Pending& p = pending_[req.name];
    if (p.by_rank.empty()) {
      p.by_rank.resize(opt_.size);
      p.from_cache.resize(opt_.size, false);
      p.members = std::move(members);
      p.first_seen = now;
    }
    if (p.by_rank[rank]) {
      // The engine refuses a name reused while in flight, so this is a misbehaving peer.
      throw ProtocolError("rank " + std::to_string(rank) + " submitted tensor '" + req.name +
                          "' twice");
    }
    p.from_cache[rank] = cached;
    p.by_rank[rank] = std::move(req);
    p.submitted++;
  }
  promote_ready(now);
}

void Coordinator::add_join(int rank) {
  if (!joined_[rank]) {
    joined_[rank] = true;
    ++joined_count_;
    last_joined_ = rank;
  }
}

void Coordinator::fail_request(const Request& req, const std::string& error) {
  Response r;
  r.kind = Response::Kind::kError;
  r.type = req.type;
  r.names = {req.name};
  r.cache_ids = {-1};
  r.error = error;
  r.process_set = req.process_set;
  failed_.push_back(std::move(r));
}

bool Coordinator::complete(const Pending& p) const {
  if (p.members) {  // a process set: its members only (join() is for the whole job)
    for (int r : *p.members)
      if (!p.by_rank[r]) return false;
    return true;
  }
  // Called for every pending tensor on every request: without joined ranks the count says it.
  if (joined_count_ == 0) return p.submitted == opt_.size;
  int covered = 0;
  for (int r = 0; r < opt_.size; ++r) covered += (p.by_rank[r] || joined_[r]) ? 1 : 0;
  return covered == opt_.size;
}

void Coordinator::promote_ready(Clock::time_point now) {
  std::vector<std::string> done;
  for (auto& [name, p] : pending_)
    if (complete(p)) done.push_back(name);
  // Grouped tensors become ready together, only once every member is complete.
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> promote;
  for (const auto& name : done) {
    const Pending& p = pending_[name];
    const Request* any = nullptr;
    for (const auto& r : p.by_rank)
      if (r) { any = &*r; break; }
    if (any && !any->group.empty()) {
      auto& members = groups[any->group];
      members.push_back(name);
      if (static_cast<int32_t>(members.size()) >= any->group_size)
        promote.insert(promote.end(), members.begin(), members.end());
    } else {
      promote.push_back(name);
    }
  }
  std::stable_sort(promote.begin(), promote.end(), [&](const std::string& a, const std::string& b) {
    return pending_[a].first_seen < pending_[b].first_seen;
  });
  for (const auto& name : promote) {
    auto it = pending_.find(name);
    ready_.emplace_back(name, std::move(it->second));
    pending_.erase(it);
    if (!oldest_ready_) oldest_ready_ = now;
  }
}

std::optional<std::string> Coordinator::validate(const std::string& name, const Pending& p) const {
  const Request* first = nullptr;
  std::vector<int> joined_ranks;
  for (int r = 0; r < opt_.size; ++r) {
    if (p.by_rank[r] && !first) first = &*p.by_rank[r];
    if (!p.by_rank[r] && !p.members) joined_ranks.push_back(r);
  }
  if (!first) return "tensor '" + name + "': no rank submitted it";
  bool all_cached = joined_ranks.empty() && !p.members &&
                    std::all_of(p.from_cache.begin(), p.from_cache.end(), [](bool b) { return b; });
  if (all_cached) return std::nullopt;  // validated when it was cached

  auto& by = p.by_rank;
  if (auto e = check_field(name, "operation", by, [](const Request& r) { return std::string(op_type_name(r.type)); })) return e;
  if (!joined_ranks.empty() && first->type != OpType::kAllreduce)
    return "tensor '" + name + "': " + op_type_name(first->type) + " cannot run while " +
           ranks_str(joined_ranks) + " joined; only allreduce can";
  if (auto e = check_field(name, "dtype", by, [](const Request& r) { return std::string(dtype_name(r.dtype)); })) return e;
  if (auto e = check_field(name, "device (CPU/GPU)", by, [](const Request& r) { return std::string(device_name(r.device)); })) return e;
  if (auto e = check_field(name, "group", by, [](const Request& r) { return r.group + "/" + std::to_string(r.group_size); })) return e;
  switch (first->type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
    case OpType::kBroadcast:
      if (auto e = check_field(name, "shape", by, [](const Request& r) { return shape_str(r.shape); })) return e;
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall:
      if (auto e = check_field(name, "shape beyond the first dimension", by, [](const Request& r) {
            return shape_str(std::vector<int64_t>(r.shape.begin() + std::min<size_t>(1, r.shape.size()), r.shape.end()));
          })) return e;
      if (auto e = check_field(name, "number of dimensions", by, [](const Request& r) { return std::to_string(r.shape.size()); })) return e;
      break;
    default:
      break;
  }
  if (is_reduction(first->type)) {
    if (auto e = check_field(name, "reduce op", by, [](const Request& r) { return std::string(reduce_op_name(r.op)); })) return e;
    if (auto e = check_field(name, "prescale factor", by, [](const Request& r) { std::ostringstream o; o << r.prescale; return o.str(); })) return e;
    if (auto e = check_field(name, "postscale factor", by, [](const Request& r) { std::ostringstream o; o << r.postscale; return o.str(); })) return e;
  }
  if (first->type == OpType::kBroadcast) {
    if (auto e = check_field(name, "root rank", by, [](const Request& r) { return std::to_string(r.root); })) return e;
    if (first->root < 0 || first->root >= opt_.size)
      return "tensor '" + name + "': root rank " + std::to_string(first->root) +
             " is out of range for " + std::to_string(opt_.size) + " ranks";
    if (p.members && !std::binary_search(p.members->begin(), p.members->end(), first->root))
      return "tensor '" + name + "': root rank " + std::to_string(first->root) + " is not in process set " +
             std::to_string(first->process_set) + " (" + members_str(*p.members) + ")";
  }
  if (first->type == OpType::kAlltoall) {
    const int n = p.members ? static_cast<int>(p.members->size()) : opt_.size;
    for (int r = 0; r < opt_.size; ++r) {
      if (!by[r]) continue;
      const Request& q = *by[r];
      if (static_cast<int>(q.splits.size()) != n)
        return "tensor '" + name + "': rank " + std::to_string(r) + " gave " +
               std::to_string(q.splits.size()) + " splits for " + std::to_string(n) + " ranks";
    }
  }
  return std::nullopt;
}

Response Coordinator::build(const std::string& name, Pending& p) {
  Response resp;
  resp.names = {name};
  if (auto err = validate(name, p)) {
    resp.kind = Response::Kind::kError;
    resp.error = err->substr(0, 4096);
    for (const auto& r : p.by_rank)
      if (r) { resp.type = r->type; break; }
    resp.cache_ids = {-1};
    for (const auto& r : p.by_rank)
      if (r) { resp.process_set = r->process_set; break; }
    for (const auto& r : p.by_rank)
      if (r && !r->group.empty()) fail_group(r->group, resp.error);
    return resp;
  }
  const Request* first = nullptr;
  for (const auto& r : p.by_rank)
    if (r) { first = &*r; break; }
  resp.type = first->type;
  resp.dtype = first->dtype;
  resp.op = first->op;
  resp.prescale = first->prescale;
  resp.postscale = first->postscale;
  resp.root = first->root;
  resp.process_set = first->process_set;
  const int n = p.members ? static_cast<int>(p.members->size()) : opt_.size;
  if (first->device == Device::kGpu && is_reduction(first->type)) scale_as_on_gpu(resp, n);
  switch (first->type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
      resp.counts = {first->num_elements()};
      break;
    case OpType::kAllgather:
      resp.row_elements = {first->row_elements()};
      for (const auto& r : p.by_rank)  // a process set: its members', in rank order
        if (r) resp.rank_rows.push_back(r->shape.empty() ? 1 : r->shape[0]);
      break;
    case OpType::kAlltoall:
      resp.row_elements = {first->row_elements()};
      for (const auto& r : p.by_rank)
        if (r) resp.splits_matrix.insert(resp.splits_matrix.end(), r->splits.begin(), r->splits.end());
      break;
    case OpType::kReducescatter: {
      resp.counts = {first->num_elements()};
      resp.row_elements = {first->row_elements()};
      int64_t rows = first->shape.empty() ? 1 : first->shape[0];
      for (int r = 0; r < n; ++r) resp.rank_rows.push_back(rows / n + (r < rows % n ? 1 : 0));
      break;
    }
    default:
      break;
  }
  remember(name, p, resp);
  if (p.members) return resp;  // never done inline: rank 0 may not even be a member
  try {
    resp.inline_result = inline_result_of(resp, p.by_rank);
  } catch (const std::exception& e) {  // the rails report it for this tensor, the engine goes on
    NZ_LOG(Warning) << "tensor '" << name << "': not done by rank 0 within negotiation (" << e.what() << ")";
  }
  return resp;
}

void Coordinator::remember(const std::string& name, const Pending& p, Response& r) {
  int32_t id = -1;
  bool everyone = !p.members &&
                  std::all_of(p.by_rank.begin(), p.by_rank.end(), [](const auto& q) { return q.has_value(); });
  if (everyone) {
    auto it = cache_index_.find(name);
    if (it != cache_index_.end()) {
      id = it->second;
    } else if (cache_.size() < opt_.cache_capacity) {
      id = static_cast<int32_t>(cache_.size());
      cache_index_[name] = id;
      cache_.emplace_back(opt_.size);
    }
    if (id >= 0)
      for (int rank = 0; rank < opt_.size; ++rank) {
        cache_[id][rank] = *p.by_rank[rank];
        cache_[id][rank].cache_id = -1;
        cache_[id][rank].inline_input.clear();
      }
  }
  r.cache_ids = {id};
}

std::vector<Response> Coordinator::fuse(std::vector<Response> in) const {
  // fusion.h: consecutive responses of one kind up to the fusion threshold; one of at least
  // unfused_bytes (as the rails scale it) runs alone (runs_unfused).
  std::vector<Response> out;
  size_t out_bytes = 0;
  bool last_alone = false;
  for (auto& r : in) {
    if (merged_inline(out, r)) continue;
    const bool fuses = fusable(r);
    size_t bytes = fuses ? fusion_bytes(r) : 0;
    const bool alone = runs_unfused(bytes, unfused_bytes_);
    if (fuses && !alone && !last_alone && !out.empty() && fuses_with(out.back(), r) &&
        out_bytes + bytes <= opt_.fusion_threshold) {
      append_fused(out.back(), r);
      out_bytes += bytes;
      continue;
    }
    out.push_back(std::move(r));
    out_bytes = bytes;
    last_alone = alone;
  }
  return out;
}

bool Coordinator::merged_inline(std::vector<Response>& out, const Response& r) const {
  // A merged result travels as one string of a control message, which the codec caps: many small
  // tensors submitted together (a TensorFlow graph's separate allreduces) must not outgrow it.
  const size_t limit = std::min(opt_.fusion_threshold, kMaxControlString);
  if (out.empty() || !inline_fuses_with(out.back(), r) ||
      out.back().inline_result.size() + r.inline_result.size() > limit)
    return false;
  append_inline_fused(out.back(), r);
  return true;
}

void Coordinator::fail_group(const std::string& group, const std::string& error) {
  if (failed_groups_.count(group)) return;
  // Members seen so far, per rank: those pending and those ready (promoted together with the one
  // that failed, so none of them has been executed yet).
  std::vector<int32_t> seen(opt_.size, 0), expected(opt_.size, 0);
  auto count = [&](const Pending& p) {
    for (int r = 0; r < opt_.size; ++r)
      if (p.by_rank[r] && p.by_rank[r]->group == group) {
        ++seen[r];
        expected[r] = p.by_rank[r]->group_size;
      }
  };
  for (const auto& [name, p] : pending_) count(p);
  for (const auto& [name, p] : ready_) count(p);
  std::string why = error + " (so every member of group '" + group + "' fails)";
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool member = std::any_of(it->second.by_rank.begin(), it->second.by_rank.end(),
                              [&](const auto& q) { return q && q->group == group; });
    if (!member) {
      ++it;
      continue;
    }
    Response r;
    r.kind = Response::Kind::kError;
    for (const auto& q : it->second.by_rank)
      if (q) { r.type = q->type; break; }
    r.names = {it->first};
    r.cache_ids = {-1};
    r.error = why;
    failed_.push_back(std::move(r));
    it = pending_.erase(it);
  }
  FailedGroup g;
  g.error = why;
  g.owed.resize(opt_.size);
  bool owed = false;
  for (int r = 0; r < opt_.size; ++r) {
    g.owed[r] = std::max(0, expected[r] - seen[r]);
    owed = owed || g.owed[r] > 0;
  }
  if (owed) failed_groups_[group] = std::move(g);
}

std::vector<Response> Coordinator::take_ready(Clock::time_point now) {
  std::vector<Response> built = take_ready_built(now);  // may fail more group members
  std::vector<Response> out = std::move(failed_);
  failed_.clear();
  out.insert(out.end(), std::make_move_iterator(built.begin()), std::make_move_iterator(built.end()));
  return out;
}

std::vector<Response> Coordinator::take_ready_built(Clock::time_point now) {
  std::vector<Response> out;
  bool all_joined = std::all_of(joined_.begin(), joined_.end(), [](bool b) { return b; });
  if (!ready_.empty()) {
    size_t ready_bytes = 0;
    for (auto& [name, p] : ready_)
      for (const auto& r : p.by_rank)
        if (r) { ready_bytes += r->bytes(); break; }
    bool hold = !pending_.empty() && !all_joined && oldest_ready_ &&
                now - *oldest_ready_ < std::chrono::duration<double>(opt_.cycle_time_s) &&
                ready_bytes < opt_.fusion_threshold;
    if (hold) return take_inline_ready();
    std::vector<Response> single;
    for (auto& [name, p] : ready_) single.push_back(build(name, p));
    ready_.clear();
    oldest_ready_.reset();
    out = fuse(std::move(single));
  }
  if (all_joined) {
    Response join;
    join.type = OpType::kJoin;
    join.names = {kJoinTensorName};
    join.cache_ids = {-1};
    join.last_joined_rank = last_joined_;
    out.push_back(join);
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
    last_joined_ = -1;
  }
  return out;
}

std::vector<Response> Coordinator::take_inline_ready() {
  // Tensors rank 0 completes itself (control_inline.h) gain nothing from waiting to fuse.
  std::vector<Response> out;
  for (auto it = ready_.begin(); it != ready_.end();) {
    std::optional<Response> r;
    if (inline_inputs_arrived(it->second.by_rank)) r = build(it->first, it->second);  // cheap test first
    if (!r || r->inline_result.empty()) {
      ++it;
      continue;
    }
    if (!merged_inline(out, *r)) out.push_back(std::move(*r));
    it = ready_.erase(it);
  }
  if (ready_.empty()) oldest_ready_.reset();
  return out;
}

std::optional<Clock::time_point> Coordinator::next_wakeup(Clock::time_point now) const {
  std::optional<Clock::time_point> t;
  auto earlier = [&](Clock::time_point c) { if (!t || c < *t) t = c; };
  if (!failed_.empty()) earlier(now);
  if (oldest_ready_)
    earlier(*oldest_ready_ + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(opt_.cycle_time_s)));
  for (const auto& [name, p] : pending_) {
    if (opt_.stall_check_s > 0 && !p.stall_warned)
      earlier(p.first_seen + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(opt_.stall_check_s)));
    if (opt_.stall_shutdown_s > 0)
      earlier(p.first_seen + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(opt_.stall_shutdown_s)));
  }
  return t;
}

int Coordinator::fewest_requests_missing() const {
  if (pending_.empty() || !ready_.empty() || !failed_.empty()) return 1;
  int fewest = opt_.size;
  for (const auto& [name, p] : pending_) {
    int missing = 0;
    auto lacks = [&](int r) { missing += (r != 0 && !p.by_rank[r] && (p.members || !joined_[r])) ? 1 : 0; };
    if (p.members) {
      for (int r : *p.members) lacks(r);
    } else {
      for (int r = 0; r < opt_.size; ++r) lacks(r);
    }
    fewest = std::min(fewest, missing);
  }
  return std::max(1, fewest);
}

std::string Coordinator::missing_ranks(const Pending& p) const {
  std::vector<int> missing;
  if (p.members) {
    for (int r : *p.members)
      if (!p.by_rank[r]) missing.push_back(r);
  } else {
    for (int r = 0; r < opt_.size; ++r)
      if (!p.by_rank[r] && !joined_[r]) missing.push_back(r);
  }
  if (!missing.empty())
    return ranks_str(missing) + (missing.size() == 1 ? " has" : " have") + " not submitted it";
  // Every rank submitted it: it waits for the other members of its group.
  const Request* any = nullptr;
  for (const auto& r : p.by_rank)
    if (r) { any = &*r; break; }
  std::string group = any ? any->group : "";
  int ready = 0;
  for (const auto& [name, q] : pending_) {
    const Request* m = nullptr;
    for (const auto& r : q.by_rank)
      if (r) { m = &*r; break; }
    if (m && m->group == group && complete(q)) ++ready;
  }
  return "every rank submitted it, but group '" + group + "' has only " + std::to_string(ready) +
         " of " + std::to_string(any ? any->group_size : 0) + " members ready";
}

std::vector<std::string> Coordinator::take_notices() {
  std::vector<std::string> out = std::move(notices_);
  notices_.clear();
  return out;
}

std::vector<Response> Coordinator::check_stalls(Clock::time_point now) {
  std::vector<Response> failed;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto& [name, p] = *it;
    double age = std::chrono::duration<double>(now - p.first_seen).count();
    if (opt_.stall_check_s > 0 && age >= opt_.stall_check_s && !p.stall_warned) {
      p.stall_warned = true;
      std::vector<int> by;
      for (int r = 0; r < opt_.size; ++r)
        if (p.by_rank[r]) by.push_back(r);
      std::string notice = "stall: tensor '" + name + "' was submitted by " + ranks_str(by) + " " +
                           std::to_string(static_cast<int>(age)) + " s ago but " + missing_ranks(p);
      NZ_LOG(Warning) << notice;
      notices_.push_back(std::move(notice));
    }
    if (opt_.stall_shutdown_s > 0 && age >= opt_.stall_shutdown_s) {
      Response r;
      r.kind = Response::Kind::kError;
      for (const auto& q : p.by_rank)
        if (q) { r.type = q->type; break; }
      r.names = {name};
      r.cache_ids = {-1};
      r.error = "tensor '" + name + "' stalled for " + std::to_string(static_cast<int>(age)) +
                " s: " + missing_ranks(p) + " (NEZHA_STALL_SHUTDOWN_S)";
      failed.push_back(std::move(r));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return failed;
}

}  // namespace nezha::engine
