#include "multirail/striping_check.h"

#include <algorithm>

#include "multirail/planner.h"

namespace nezha::multirail {

int check_class(size_t bytes) {
  if (bytes <= kCheckMinBytes || bytes > kMidBandMaxBytes) return -1;
  int k = 0;  // bytes in (2^(11+k), 2^(12+k)]
  while ((size_t{1} << (12 + k)) < bytes) ++k;
  return k;
}

bool check_explores(uint64_t n) {
  if (n == 0) return false;
  const uint64_t period = n <= kCheckEarlyPlans ? kCheckEarlyPeriod : kCheckExplorePeriod;
  return (n - 1) % period >= period - kCheckExploreRun;
}

void StripingCheck::Recent::add(double s) {
  seconds[next] = s;
  next = (next + 1) % kCheckWindow;
  count = std::min(count + 1, kCheckWindow);
  if (count < kCheckMinSamples) return;
  double sorted[kCheckWindow];
  std::copy(seconds, seconds + count, sorted);
  std::nth_element(sorted, sorted + count / 2, sorted + count);
  median = sorted[count / 2];
}

void StripingCheck::observe(size_t bytes, bool striped, double seconds) {
  const int k = check_class(bytes);
  if (k < 0 || !(seconds >= 0) || !(seconds < 1e9)) return;
  (striped ? striped_ : whole_)[k].add(seconds);
}

double StripingCheck::median_seconds(int cls, bool striped) const {
  if (cls < 0 || cls >= kCheckClasses) return 0;
  return (striped ? striped_ : whole_)[cls].median;
}

uint64_t min_striped_bytes(const std::vector<StripingCheck>& ranks) {
  // From the largest class down: the first one where striping lost sets the floor. The
  // smaller classes are not asked: what striping costs beyond its shares is per operation, while
  // what it saves grows with the payload, so a loss at one size is a loss below it too.
  for (int k = kCheckClasses - 1; k >= 0; --k) {
    double striped = 0, whole = 0;
    for (const StripingCheck& r : ranks) {
      striped = std::max(striped, r.median_seconds(k, true));
      whole = std::max(whole, r.median_seconds(k, false));
    }
    if (striped > 0 && whole > 0 && striped > (1 + kCheckLossMargin) * whole)
      return (uint64_t{1} << (12 + k)) + 1;
  }
  return 0;
}

}  // namespace nezha::multirail
