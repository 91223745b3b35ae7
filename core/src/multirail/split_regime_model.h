// A rail's cost as the planner needs it, learned from three size regimes separately.
//
// Why not one least-squares fit over every size: real links are not linear. A token-bucket shaper,
// switch buffers or NIC coalescing let a small transfer through at line rate while a sustained one
// runs at the provisioned rate; one fit over a few large and hundreds of small samples (a training
// step has many small tensors) then reports the burst rate as the bandwidth and stripes large
// payloads wrongly. So: alpha comes from small payloads (where it dominates), beta and the bulk
// start-up (RailEstimate::bulk_alpha_us) from large ones (where bandwidth dominates), each adapting
// on its own. The mid band between them (RailEstimate::mid_alpha_us, mid_beta_gbps) runs another
// algorithm (halving/doubling: 2 log2(n) steps and the ring's bytes) whose messages on shaped links
// still fit the burst, so neither neighbour prices it (16 hosts, 1 Gbit/s: 256 KB took 4.0 ms where
// small alpha plus large beta said 6.0, benchmarks/SCALE.md). It has a rate of its own, learned
// from the operations that fall in it, with the small payloads' time as its start-up; calibration
// runs none there (a rested bucket makes them look several times faster than they run).
#pragma once

#include <cstddef>

#include "multirail/cost_model.h"
#include "multirail/planner.h"

namespace nezha::multirail {

class SplitRegimeModel {
 public:
  // Payloads below small_max_bytes inform alpha; those above it up to mid_max_bytes the mid band's
  // fit; those from large_min_bytes on beta.
  SplitRegimeModel(RailCostModelOptions opt = {}, size_t small_max_bytes = kLatencyBoundBytes,
                   size_t mid_max_bytes = kMidBandMaxBytes, size_t large_min_bytes = 512 << 10);

  void observe(size_t bytes, double seconds);
  RailEstimate estimate() const;  // known once both regimes have been observed

 private:
  RailCostModel large_;
  RailCostModel mid_;
  double alpha_s_ = -1;   // EWMA of small-payload times (seconds); < 0 until observed
  uint64_t small_samples_ = 0;
  // The first small samples are calibration's three (RailTable::calibration_bytes). The EWMA starts
  // from their median, not the first: one of them stalled by a busy host would price the rail's
  // start-up at the stall, and that keeps the rail out of every striped plan (its bulk start-up is
  // at least this), while nothing re-measures its small payloads: they go to the rail with the
  // lower start-up.
  static constexpr int kSeedSamples = 3;
  double seed_s_[kSeedSamples] = {};
  size_t small_max_bytes_;
  size_t mid_max_bytes_;
  size_t large_min_bytes_;
};

}  // namespace nezha::multirail
