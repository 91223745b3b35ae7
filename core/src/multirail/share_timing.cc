#include "multirail/share_timing.h"

#include <algorithm>

namespace nezha::multirail {

double rail_share_seconds(double total_seconds, const std::vector<double>& call_seconds, double floor_seconds) {
  if (call_seconds.size() < 2 || !(total_seconds > 0)) return std::max(total_seconds, 0.0);
  std::vector<double> sorted = call_seconds;
  // The upper quartile, rounded down: with two calls the faster one (one of two waited).
  auto quartile = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) * 3 / 4);
  std::nth_element(sorted.begin(), quartile, sorted.end());
  const double reference = *quartile;
  double waited = 0;
  for (double c : call_seconds)
    if (c > kPeerWaitRatio * reference && c - reference > kMinPeerWaitSeconds) waited += c - reference;
  const double own = std::clamp(total_seconds - waited, 0.0, total_seconds);
  return waited > 0 ? std::max(own, std::min(floor_seconds, total_seconds)) : own;
}

}  // namespace nezha::multirail
