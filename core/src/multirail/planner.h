// Split planner: how one (fused) buffer is divided among the rails.
//
// The coordinator (rank 0) computes the plan for each fused buffer and sends it with the negotiation
// response, so every rank uses the same split; plan_split() is also deterministic (same input, same
// output, bit for bit) so any rank recomputing it from the same estimates agrees.
//
//  * cold: some usable rail has no estimate yet: the whole payload goes to the usable rail with the
//    lowest alpha (the lowest-index usable rail when no usable rail is known); or the payload is
//    below striping_threshold_bytes(): to the rail predicted to finish it first.
//  * Prices: a latency-bound payload (below kLatencyBoundBytes) pays a rail's alpha_us; a share that
//    moves bandwidth pays max(alpha_us, bulk_alpha_us), since a ring's step count (and so its
//    start-up) grows with the ranks where the log-step's does not.
//  * Mid band (above kLatencyBoundBytes, up to kMidBandMaxBytes): once a usable rail has a fit of
//    that band (RailEstimate::mid_known), a payload there is priced by it (by the bulk price on a
//    rail without one), and so is each share, except one no larger than kLatencyBoundBytes: that
//    runs the log-step and pays the latency price. While no rail has a fit, the prices above.
//  * hot: water filling. Rails take shares so that they all finish at the same time T:
//    share_i = max(0, (T - alpha_i) * beta_i), summing to the payload; a rail whose alpha exceeds T
//    gets nothing. Shares are rounded down to whole elements and to align_bytes; the whole aligned
//    units left over go to the fastest rail (highest beta), and the final sub-alignment tail of the
//    buffer (count not a multiple of the alignment) to the last share, so every share starts at an
//    aligned offset. Shares are contiguous in rail order; zero-count shares are omitted.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "multirail/cost_model.h"

namespace nezha::multirail {

struct RailShare {
  int rail;       // index into PlanRequest::rails
  size_t offset;  // in elements, from the start of the buffer
  size_t count;   // in elements
};

struct PlanRequest {
  size_t count = 0;      // elements in the buffer
  size_t elem_size = 0;  // bytes per element
  std::vector<RailEstimate> rails;
  std::vector<bool> usable;  // same length as rails: up and allowed to carry this operation
  size_t align_bytes = 64;   // every share starts at a multiple of this (and of elem_size)
};

struct Plan {
  std::vector<RailShare> shares;  // in rail order; counts sum to PlanRequest::count
  bool striped = false;           // more than one rail carries data
  std::string why;                // one line for logs and the timeline
};

// Throws InvalidArgument for elem_size or align_bytes 0, rails/usable of different lengths, or a
// payload whose size overflows size_t; NezhaError when no rail is usable. count == 0 -> empty plan.
Plan plan_split(const PlanRequest& request);

// The whole payload on the usable, known rail predicted to finish it first (predicted_seconds; ties:
// the lower index); `why` leads the plan's reason. Throws as plan_split does, and NezhaError when no
// usable rail is known.
Plan plan_whole(const PlanRequest& request, const std::string& why);

// Smallest payload (bytes) from which striping over the usable, known rails is predicted to be at
// least kMinStripingGain faster than the best single rail, by the latency and bulk prices (plan_split
// decides a mid-band payload by the mid-band prices once a rail has them); SIZE_MAX if it never is
// (fewer than two usable known rails, or the other rails add too little bandwidth).
size_t striping_threshold_bytes(const std::vector<RailEstimate>& rails,
                                const std::vector<bool>& usable);

// Payloads below this run a latency-bound algorithm (log-step; the executor's default
// logstep_max_bytes) and are priced with RailEstimate::alpha_us; larger ones, and every striped
// share, with the bulk start-up max(alpha_us, bulk_alpha_us).
constexpr size_t kLatencyBoundBytes = size_t{64} << 10;

// Payloads above kLatencyBoundBytes up to this run halving/doubling (the executor's defaults:
// logstep_max_bytes, halving_max_bytes); the rails' cost models fit this band on its own
// (RailEstimate::mid_alpha_us) and the planner prices it by that fit.
constexpr size_t kMidBandMaxBytes = size_t{256} << 10;
bool in_mid_band(size_t bytes);

// The predicted time (seconds) of `bytes` whole on one known rail, by the prices above.
double predicted_seconds(const RailEstimate& rail, size_t bytes);

// A re-balanced operation (engine/execution/share_balancer.h) runs its shares as several ranges, each
// paying the rail's bulk start-up again (a ring's 2(n-1) steps). Ranges no smaller than this keep
// that start-up within 1/kRangeAmortization of a range's time; on few ranks or slow links it is far
// below the balancer's own minimum and changes nothing.
constexpr double kRangeAmortization = 8;
size_t amortized_range_bytes(const RailEstimate& rail);

// Striping must save at least this fraction of the best single rail's predicted time. Below it the
// gain is within the model's error, and it would cost the per-rail bookkeeping the model ignores.
constexpr double kMinStripingGain = 0.05;

}  // namespace nezha::multirail
