#include "multirail/rail_table.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/error.h"

namespace nezha::multirail {

namespace {

size_t source_index(PlanSource s) { return s == PlanSource::kNegotiation ? 0 : 1; }

}  // namespace

double share_gbps_prior(double link_gbps, bool collective_rail, int ranks) {
  if (link_gbps <= 0 || collective_rail || ranks < 2) return link_gbps;
  return link_gbps * ranks / (2.0 * (ranks - 1));
}

RailTable::RailTable(std::vector<RailDescription> rails, RailCostModelOptions options)
    : rails_(std::move(rails)),
      models_(rails_.size(), SplitRegimeModel(options)),
      states_(rails_.size(), RailState::kUp),
      current_share_(rails_.size(), 0.0) {
  if (rails_.empty()) throw InvalidArgument("a rail table needs at least one rail");
  for (auto& counters : idle_large_ops_) counters.assign(rails_.size(), 0);
  current_share_[0] = 1.0;  // until a plan says otherwise, everything runs on rail 0
}

void RailTable::observe(int rail, size_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  models_.at(static_cast<size_t>(rail)).observe(bytes, seconds);
}

double RailTable::own_predicted_seconds(int rail, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const RailEstimate e = models_.at(static_cast<size_t>(rail)).estimate();
  return e.known() ? predicted_seconds(e, bytes) : 0.0;
}

void RailTable::observe_operation(size_t bytes, bool striped, double seconds) {
  if (rails_.size() < 2 || check_class(bytes) < 0) return;  // one rail: nothing to decide
  std::lock_guard<std::mutex> lock(mu_);
  // An operation after one of the other kind is not what a run of its kind costs (check_explores).
  int& last = last_checked_[check_class(bytes)];
  const bool after_switch = last != (striped ? 1 : 0);
  last = striped ? 1 : 0;
  if (after_switch) return;
  if (reports_operations_) {
    if (outbox_.size() == kMaxReportedOperations) outbox_.erase(outbox_.begin());
    outbox_.push_back(OperationTime{static_cast<uint32_t>(bytes), striped, static_cast<float>(seconds)});
    return;
  }
  if (rank_checks_.empty()) rank_checks_.resize(1);
  rank_checks_[0].observe(bytes, striped, seconds);
  min_striped_stale_ = true;
}

void RailTable::report_operations_to_coordinator() {
  std::lock_guard<std::mutex> lock(mu_);
  reports_operations_ = true;
}

std::vector<OperationTime> RailTable::take_operation_times() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(outbox_, {});
}

void RailTable::observe_rank_operations(int rank, const std::vector<OperationTime>& times) {
  if (rank <= 0) throw InvalidArgument("observe_rank_operations: rank " + std::to_string(rank) + " is not a peer");
  if (times.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (rank_checks_.size() <= static_cast<size_t>(rank)) rank_checks_.resize(static_cast<size_t>(rank) + 1);
  for (const OperationTime& t : times) rank_checks_[static_cast<size_t>(rank)].observe(t.bytes, t.striped, t.seconds);
  min_striped_stale_ = true;
}

RailEstimate RailTable::estimate_locked(size_t rail) const {
  RailEstimate e = models_[rail].estimate();
  if (min_striped_stale_) {  // O(ranks) per new sample would be O(ranks^2) per operation on rank 0
    min_striped_bytes_ = min_striped_bytes(rank_checks_);
    min_striped_stale_ = false;
  }
  e.min_striped_bytes = min_striped_bytes_;
  if (!e.known() && rails_[rail].gbps_prior > 0) {
    // The transport's prior until the rail has been measured; it stands for one sample.
    e.alpha_us = rails_[rail].latency_us_prior;
    e.beta_gbps = rails_[rail].gbps_prior;
    e.samples = 1;
  }
  return e;
}

std::vector<RailEstimate> RailTable::estimates() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RailEstimate> out;
  for (size_t i = 0; i < rails_.size(); ++i) out.push_back(estimate_locked(i));
  return out;
}

void RailTable::set_shared_estimates(std::vector<RailEstimate> estimates) {
  std::lock_guard<std::mutex> lock(mu_);
  shared_estimates_ = std::move(estimates);
}

void RailTable::set_state(int rail, RailState state) {
  std::lock_guard<std::mutex> lock(mu_);
  states_.at(static_cast<size_t>(rail)) = state;
  if (state != RailState::kUp) current_share_[static_cast<size_t>(rail)] = 0;
}

RailState RailTable::state(int rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.at(static_cast<size_t>(rail));
}

std::vector<bool> RailTable::usable() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> out;
  for (RailState s : states_) out.push_back(s == RailState::kUp);
  return out;
}

bool RailTable::collective_runs(size_t rail, const OpToPlan& op) const {
  const RailDescription& r = rails_[rail];
  const bool reduces = r.reduces && r.reduces(op.dtype, op.op);
  if (op.allreduce) return reduces;
  if (op.other == RailOp::kNone || !r.runs || !r.runs(op.other)) return false;
  return op.other != RailOp::kReducescatter || reduces;
}

std::vector<bool> RailTable::usable_for(const OpToPlan& op) const {
  std::vector<bool> out = usable();
  for (size_t i = 0; i < rails_.size(); ++i)
    if (!rails_[i].point_to_point && !collective_runs(i, op)) out[i] = false;
  return out;
}

int RailTable::whole_on_collective_rail(const OpToPlan& op, const std::vector<RailEstimate>& est,
                                        const std::vector<bool>& usable) const {
  std::vector<bool> collective(rails_.size(), false);
  bool any = false;
  for (size_t i = 0; i < rails_.size() && i < usable.size(); ++i)
    any |= collective[i] = usable[i] && !rails_[i].point_to_point;
  if (!any) return -1;
  const size_t bytes = op.count * op.elem_size;
  if (bytes >= kCollectiveHostMemoryBytes) return pick_single_rail(est, collective, bytes);
  const int fastest = pick_single_rail(est, usable, bytes);
  return collective[static_cast<size_t>(fastest)] ? fastest : -1;
}

int RailTable::pick_single_rail(const std::vector<RailEstimate>& estimates,
                                const std::vector<bool>& usable, size_t bytes) const {
  // Lowest alpha among usable, known rails (ties: lower index); the first usable rail when none is
  // known. Rails whose max_share_bytes is below the payload are passed over while another fits.
  for (bool honour_cap : {true, false}) {
    int best = -1, first = -1;
    for (size_t i = 0; i < rails_.size() && i < usable.size(); ++i) {
      if (!usable[i]) continue;
      if (honour_cap && rails_[i].max_share_bytes != 0 && bytes > rails_[i].max_share_bytes) continue;
      if (first < 0) first = static_cast<int>(i);
      if (i < estimates.size() && estimates[i].known() &&
          (best < 0 || estimates[i].alpha_us < estimates[static_cast<size_t>(best)].alpha_us))
        best = static_cast<int>(i);
    }
    if (best >= 0) return best;
    if (first >= 0) return first;
  }
  throw NezhaError("no usable rail among " + std::to_string(rails_.size()));
}

Plan RailTable::plan(const OpToPlan& op, PlanSource source,
                                       const std::vector<RailEstimate>& round_estimates,
                                       const std::function<void(int rail, size_t bytes)>& on_probe) {
  if (rails_.size() == 1) return Plan{{}, false, "one rail"};
  const std::vector<RailEstimate> est = source == PlanSource::kRound ? round_estimates : estimates();
  if (est.size() != rails_.size()) return Plan{{}, false, "no estimates: rail 0"};
  std::vector<bool> ok = usable_for(op);
  if (!op.splittable) {
    if (source == PlanSource::kRound) return Plan{{}, false, "not split"};  // rounds: allreduces only
    const int rail = pick_single_rail(est, ok, op.count * op.elem_size);
    return Plan{{RailShare{rail, 0, op.count}}, false, "single rail " + std::to_string(rail)};
  }
  // Rails through this host's memory share its CPUs and memory bandwidth: a collective one striped
  // with a point-to-point one (shmcoll beside the shm ring) makes both slower, where rails on
  // separate links add up. Only one kind of the two takes the allreduce, and probes (below) lend the
  // other none: large payloads, the only ones probed, always go to the collective kind.
  std::vector<bool> split_ok = ok;
  if (op.allreduce || op.other != RailOp::kNone) keep_one_host_memory_kind(est, split_ok, op.count * op.elem_size);
  if (!op.allreduce) {
    // A collective rail runs a broadcast, allgather, reducescatter or alltoall whole, by the allreduce's rule
    // between the host-memory kinds (keep_one_host_memory_kind); otherwise the point-to-point rails
    // stripe it.
    const int whole = whole_on_collective_rail(op, est, split_ok);
    if (whole >= 0) return Plan{{RailShare{whole, 0, op.count}}, false, "whole on collective rail " + std::to_string(whole)};
    for (size_t i = 0; i < rails_.size(); ++i)
      if (!rails_[i].point_to_point) split_ok[i] = ok[i] = false;
  }
  PlanRequest pr;
  pr.count = op.count;
  pr.elem_size = op.elem_size;
  pr.rails = est;
  pr.usable = split_ok;
  Plan plan = plan_split(pr);
  if (op.allreduce) check_striping(plan, pr, source);
  std::vector<int> counters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters = idle_large_ops_[source_index(source)];
  }
  add_probe_shares(plan, est, op.count, op.elem_size, counters, op.allreduce ? split_ok : ok, on_probe);
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_large_ops_[source_index(source)] = counters;
  }
  cap_shares(plan, split_ok, op.count, op.elem_size);
  return plan;
}

void RailTable::check_striping(Plan& plan, const PlanRequest& request, PlanSource source) {
  const size_t bytes = request.count * request.elem_size;
  const int cls = check_class(bytes);
  if (!plan.striped || cls < 0) return;
  uint64_t floor = 0;
  for (size_t i = 0; i < request.rails.size(); ++i)
    if (request.usable[i]) floor = std::max(floor, request.rails[i].min_striped_bytes);
  uint64_t contested;
  {
    std::lock_guard<std::mutex> lock(mu_);
    contested = ++contested_plans_[source_index(source)][cls];
  }
  const bool explore = check_explores(contested);
  const bool below_floor = bytes < floor;
  if (below_floor == explore) {
    if (explore) plan.why += " (striping checked: striped for the measure)";
    return;
  }
  std::string why = below_floor ? "striping measured slower below " + std::to_string(floor) + " B"
                                : "striping checked: whole for the measure";
  plan = plan_whole(request, why);
}

void RailTable::keep_one_host_memory_kind(const std::vector<RailEstimate>& est, std::vector<bool>& usable,
                                          size_t bytes) const {
  constexpr double kUnknown = std::numeric_limits<double>::infinity();
  double best[2] = {kUnknown, kUnknown};  // [collective, point to point]: predicted us alone
  bool present[2] = {false, false};
  for (size_t i = 0; i < rails_.size() && i < usable.size() && i < est.size(); ++i) {
    if (!usable[i] || !rails_[i].host_memory) continue;
    const int kind = rails_[i].point_to_point ? 1 : 0;
    present[kind] = true;
    if (!est[i].known()) continue;
    best[kind] = std::min(best[kind], predicted_seconds(est[i], bytes) * 1e6);
  }
  if (!present[0] || !present[1]) return;
  // Large: the collective kind, whatever the estimates say (kCollectiveHostMemoryBytes). Smaller:
  // both estimated, the one predicted faster; else the plan's cold rule (one rail, lowest alpha).
  const bool large = bytes >= kCollectiveHostMemoryBytes;
  if (!large && (best[0] == kUnknown || best[1] == kUnknown)) return;
  const bool collective_wins = large || best[0] <= best[1];
  for (size_t i = 0; i < rails_.size() && i < usable.size(); ++i)
    if (usable[i] && rails_[i].host_memory && rails_[i].point_to_point == collective_wins) usable[i] = false;
}

void RailTable::cap_shares(Plan& plan, const std::vector<bool>& usable, size_t count,
                           size_t elem_size) const {
  bool any_cap = false;
  for (const auto& r : rails_) any_cap = any_cap || r.max_share_bytes != 0;
  if (!any_cap || count == 0) return;
  const size_t n = rails_.size();
  std::vector<size_t> counts(n, 0);
  for (const auto& sh : plan.shares) counts[static_cast<size_t>(sh.rail)] += sh.count;
  auto room = [&](size_t r) -> size_t {
    if (!usable[r]) return 0;
    if (rails_[r].max_share_bytes == 0) return std::numeric_limits<size_t>::max();
    const size_t cap = rails_[r].max_share_bytes / elem_size;
    return cap > counts[r] ? cap - counts[r] : 0;
  };
  size_t excess = 0;
  for (size_t r = 0; r < n; ++r) {
    if (rails_[r].max_share_bytes == 0) continue;
    const size_t cap = rails_[r].max_share_bytes / elem_size;
    if (counts[r] > cap) {
      excess += counts[r] - cap;
      counts[r] = cap;
    }
  }
  if (excess == 0) return;
  // The excess goes first to rails that already carry a share (they are the ones the model chose),
  // then to any usable rail, in rail order, as far as each one's room allows.
  for (bool carrying_only : {true, false})
    for (size_t r = 0; r < n && excess > 0; ++r) {
      if (carrying_only && counts[r] == 0) continue;
      const size_t take = std::min(excess, room(r));
      counts[r] += take;
      excess -= take;
    }
  if (excess > 0) {
    // Every usable rail is at its limit: the payload must still go somewhere; the rail with the
    // largest limit takes the rest.
    size_t widest = 0;
    for (size_t r = 0; r < n; ++r)
      if (usable[r] && (!usable[widest] || rails_[r].max_share_bytes > rails_[widest].max_share_bytes)) widest = r;
    counts[widest] += excess;
  }
  plan.shares.clear();
  size_t offset = 0;
  for (size_t r = 0; r < n; ++r) {
    if (counts[r] == 0) continue;
    plan.shares.push_back(RailShare{static_cast<int>(r), offset, counts[r]});
    offset += counts[r];
  }
  plan.striped = plan.shares.size() > 1;
}

void RailTable::record_plan(const std::vector<RailShare>& shares) {
  if (shares.empty()) return;
  size_t total = 0;
  for (const auto& sh : shares) total += sh.count;
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(current_share_.begin(), current_share_.end(), 0.0);
  for (const auto& sh : shares)
    if (total) current_share_[static_cast<size_t>(sh.rail)] += static_cast<double>(sh.count) / total;
}

std::vector<RailStatus> RailTable::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RailStatus> out;
  for (size_t i = 0; i < rails_.size(); ++i) {
    RailStatus s;
    s.state = states_[i];
    s.estimate = i < shared_estimates_.size() ? shared_estimates_[i] : estimate_locked(i);
    s.share = current_share_[i];
    out.push_back(s);
  }
  return out;
}

std::vector<size_t> RailTable::calibration_bytes() {
  return {size_t{4096}, size_t{4096}, size_t{4096}, size_t{512} << 10, size_t{1} << 20, size_t{2} << 20};
}

void add_probe_shares(Plan& plan, const std::vector<RailEstimate>& est, size_t count,
                      size_t elem_size, std::vector<int>& idle_large_ops,
                      const std::vector<bool>& usable,
                      const std::function<void(int rail, size_t bytes)>& on_probe) {
  // A rail that carries nothing is never measured again, so a wrong or outdated estimate (or a
  // rail that got faster) would exclude it for good. Large payloads therefore lend a small probe
  // share to a rail that is unknown or has been idle for kProbeEvery large operations.
  constexpr size_t kMinProbeBytes = size_t{1} << 20;
  constexpr int kProbeEvery = 16;
  if (count * elem_size < kMinProbeBytes * 4) return;
  std::vector<bool> has_share(est.size(), false);
  for (const auto& sh : plan.shares) has_share[sh.rail] = sh.count > 0;
  for (size_t rail = 0; rail < est.size(); ++rail) {
    if (!usable.empty() && !usable[rail]) continue;
    if (has_share[rail]) {
      idle_large_ops[rail] = 0;
      continue;
    }
    if (est[rail].known() && ++idle_large_ops[rail] < kProbeEvery) continue;
    idle_large_ops[rail] = 0;
    // Take the probe from the end of the largest share (offsets stay contiguous).
    auto largest = std::max_element(plan.shares.begin(), plan.shares.end(),
                                    [](const auto& a, const auto& b) { return a.count < b.count; });
    size_t probe = std::max(kMinProbeBytes / elem_size, count / 50);
    if (largest == plan.shares.end() || largest->count < 2 * probe) continue;
    largest->count -= probe;
    for (auto it = largest + 1; it != plan.shares.end(); ++it) it->offset -= probe;
    plan.shares.push_back({static_cast<int>(rail), count - probe, probe});
    if (on_probe) on_probe(static_cast<int>(rail), probe * elem_size);
  }
}

}  // namespace nezha::multirail
