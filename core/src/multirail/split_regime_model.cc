#include "multirail/split_regime_model.h"

#include <algorithm>

namespace nezha::multirail {
namespace {
constexpr double kAlphaWeight = 0.2;  // EWMA weight of a new small-payload time
}

SplitRegimeModel::SplitRegimeModel(RailCostModelOptions opt, size_t small_max_bytes,
                                   size_t large_min_bytes)
    : large_(opt), small_max_bytes_(small_max_bytes), large_min_bytes_(large_min_bytes) {}

void SplitRegimeModel::observe(size_t bytes, double seconds) {
  if (bytes < small_max_bytes_) {
    alpha_s_ = alpha_s_ < 0 ? seconds : (1 - kAlphaWeight) * alpha_s_ + kAlphaWeight * seconds;
    ++small_samples_;
  }
  if (bytes >= large_min_bytes_) large_.observe(bytes, seconds);
}

RailEstimate SplitRegimeModel::estimate() const {
  RailEstimate e = large_.estimate();
  e.samples += small_samples_;
  if (!e.known()) return RailEstimate{0, 0, e.samples};
  // The large-payload fit's intercept is what a bandwidth-bound share pays before its bytes move (a
  // ring's 2(n-1) steps); a latency-bound payload runs another algorithm and sees the measured
  // small-payload time instead. The planner needs both.
  e.bulk_alpha_us = e.alpha_us;
  if (alpha_s_ >= 0) e.alpha_us = alpha_s_ * 1e6;
  return e;
}

}  // namespace nezha::multirail
