// A rail's cost as the planner needs it, learned from two size regimes separately.
//
// Why not one least-squares fit over every size: real links are not linear. A token-bucket shaper,
// switch buffers or NIC coalescing let a small transfer through at line rate while a sustained one
// runs at the provisioned rate; one fit over a few large and hundreds of small samples (a training
// step has many small tensors) then reports the burst rate as the bandwidth and stripes large
// payloads wrongly. So: alpha comes from small payloads (where it dominates), beta and the bulk
// start-up (RailEstimate::bulk_alpha_us) from large ones (where bandwidth dominates), each adapting
// on its own.
#pragma once

#include <cstddef>

#include "multirail/cost_model.h"

namespace nezha::multirail {

class SplitRegimeModel {
 public:
  // Payloads below small_max_bytes inform alpha; those from large_min_bytes on inform beta.
  SplitRegimeModel(RailCostModelOptions opt = {}, size_t small_max_bytes = 64 << 10,
                   size_t large_min_bytes = 512 << 10);

  void observe(size_t bytes, double seconds);
  RailEstimate estimate() const;  // known once both regimes have been observed

 private:
  RailCostModel large_;
  double alpha_s_ = -1;   // EWMA of small-payload times (seconds); < 0 until observed
  uint64_t small_samples_ = 0;
  size_t small_max_bytes_;
  size_t large_min_bytes_;
};

}  // namespace nezha::multirail
