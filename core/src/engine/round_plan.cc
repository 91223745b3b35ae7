#include "engine/round_plan.h"

#include <algorithm>

namespace nezha::engine {

void add_probe_shares(multirail::Plan& plan, const std::vector<multirail::RailEstimate>& est,
                      size_t count, size_t elem_size, std::vector<int>& idle_large_ops,
                      const std::vector<bool>& usable, const std::function<void(int rail, size_t bytes)>& on_probe) {
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

std::vector<multirail::RailShare> plan_from_estimates(const Response& resp,
                                                      const std::vector<multirail::RailEstimate>& est,
                                                      std::vector<bool> usable,
                                                      std::vector<int>* idle_large_ops) {
  if (est.size() < 2 || resp.kind != Response::Kind::kExecute || resp.type != OpType::kAllreduce)
    return {};
  size_t count = 0;
  for (int64_t c : resp.counts) count += static_cast<size_t>(c);
  multirail::PlanRequest pr;
  pr.count = count;
  pr.elem_size = dtype_size(resp.dtype);
  pr.rails = est;
  pr.usable = usable.empty() ? std::vector<bool>(est.size(), true) : std::move(usable);
  multirail::Plan plan = multirail::plan_split(pr);
  if (idle_large_ops && idle_large_ops->size() == est.size())
    add_probe_shares(plan, est, count, pr.elem_size, *idle_large_ops, pr.usable);
  return plan.shares;
}

}  // namespace nezha::engine
