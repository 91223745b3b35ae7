// Rail plans for operations no coordinator dispatched (cache rounds): every rank computes the plan
// itself, from inputs that are identical on every rank (rank 0's estimates carried in the round's
// vector, the probe counters updated in the total order), so every rank gets the same split.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "multirail/cost_model.h"
#include "multirail/planner.h"

namespace nezha::engine {

// Large payloads lend a small probe share to a rail that is unknown or idle for a while, so a
// rail's estimate can recover. idle_large_ops[rail] counts large operations since the rail last
// carried a share; only rails marked in `usable` (empty: all) are probed; `on_probe` (may be empty)
// is told of each probe.
void add_probe_shares(multirail::Plan& plan, const std::vector<multirail::RailEstimate>& est,
                      size_t count, size_t elem_size, std::vector<int>& idle_large_ops,
                      const std::vector<bool>& usable = {},
                      const std::function<void(int rail, size_t bytes)>& on_probe = {});

// The plan of an allreduce response from rank 0's estimates: empty (whole on rail 0) with one rail
// or without estimates. `usable` (empty: every rail) masks rails that may not carry data: the one
// place a per-rail usable mask applies to round plans. `idle_large_ops` as above, or null: no probes.
std::vector<multirail::RailShare> plan_from_estimates(const Response& resp,
                                                      const std::vector<multirail::RailEstimate>& est,
                                                      std::vector<bool> usable = {},
                                                      std::vector<int>* idle_large_ops = nullptr);

}  // namespace nezha::engine
