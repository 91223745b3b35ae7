#include "multirail/share_timing.h"

#include <algorithm>

namespace nezha::multirail {

double rail_share_seconds(double total_seconds, const std::vector<double>& call_seconds) {
  if (call_seconds.size() < 2 || !(total_seconds > 0)) return std::max(total_seconds, 0.0);
  std::vector<double> sorted = call_seconds;
  // The lower median: with two calls, the faster one is the reference (one of two waited).
  auto mid = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  const double typical = *mid;
  double waited = 0;
  for (double c : call_seconds)
    if (c > kPeerWaitRatio * typical && c - typical > kMinPeerWaitSeconds) waited += c - typical;
  return std::clamp(total_seconds - waited, 0.0, total_seconds);
}

}  // namespace nezha::multirail
