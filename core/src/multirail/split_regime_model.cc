#include "multirail/split_regime_model.h"

#include <algorithm>

namespace nezha::multirail {
namespace {
constexpr double kAlphaWeight = 0.2;  // EWMA weight of a new small-payload time
}

SplitRegimeModel::SplitRegimeModel(RailCostModelOptions opt, size_t small_max_bytes,
                                   size_t mid_max_bytes, size_t large_min_bytes)
    : large_(opt),
      mid_(opt),
      small_max_bytes_(small_max_bytes),
      mid_max_bytes_(mid_max_bytes),
      large_min_bytes_(large_min_bytes) {}

void SplitRegimeModel::observe(size_t bytes, double seconds) {
  if (bytes < small_max_bytes_) {
    if (small_samples_ < kSeedSamples) {
      // Median of the seeds so far (of two, the smaller: a stall is the one to leave out).
      seed_s_[small_samples_] = seconds;
      double sorted[kSeedSamples];
      const int n = static_cast<int>(small_samples_) + 1;
      std::copy(seed_s_, seed_s_ + n, sorted);
      std::sort(sorted, sorted + n);
      alpha_s_ = sorted[(n - 1) / 2];
    } else {
      alpha_s_ = (1 - kAlphaWeight) * alpha_s_ + kAlphaWeight * seconds;
    }
    ++small_samples_;
  } else if (bytes > small_max_bytes_ && bytes <= mid_max_bytes_) {
    // This band's traffic comes in few sizes per rail (a model's buckets, a share of them), which
    // cannot tell a start-up from a rate: a free fit of 256 KB calls on the testbed drifted to
    // 0 us and 9.5 Gbit/s. The rail's small-payload time is the nearest start-up there is (the
    // log-step's log2(n) steps against halving/doubling's 2 log2(n)), so only the rate is fitted.
    mid_.anchor_alpha(std::max(alpha_s_, 0.0));
    mid_.observe(bytes, seconds);
  }
  if (bytes >= large_min_bytes_) large_.observe(bytes, seconds);
}

RailEstimate SplitRegimeModel::estimate() const {
  RailEstimate e = large_.estimate();
  const RailEstimate mid = mid_.estimate();
  e.samples += small_samples_ + mid.samples;
  if (!e.known()) return RailEstimate{0, 0, e.samples};
  // The large-payload fit's intercept is what a bandwidth-bound share pays before its bytes move (a
  // ring's 2(n-1) steps); a latency-bound payload runs another algorithm and sees the measured
  // small-payload time instead. The planner needs both.
  e.bulk_alpha_us = e.alpha_us;
  if (alpha_s_ >= 0) e.alpha_us = alpha_s_ * 1e6;
  if (mid.known()) {
    e.mid_alpha_us = mid.alpha_us;
    e.mid_beta_gbps = mid.beta_gbps;
  }
  return e;
}

}  // namespace nezha::multirail
