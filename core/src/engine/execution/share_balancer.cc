#include "engine/execution/share_balancer.h"

#include <algorithm>

namespace nezha::engine {

size_t leader_min_range_bytes(const std::vector<multirail::RailShare>& plan,
                              const std::vector<multirail::RailEstimate>& estimates, size_t agreed_min) {
  const auto largest = std::max_element(plan.begin(), plan.end(),
                                        [](const auto& a, const auto& b) { return a.count < b.count; });
  if (largest == plan.end() || static_cast<size_t>(largest->rail) >= estimates.size()) return agreed_min;
  return std::max(agreed_min, multirail::amortized_range_bytes(estimates[static_cast<size_t>(largest->rail)]));
}

ShareBalancer::ShareBalancer(const std::vector<multirail::RailShare>& plan, size_t min_claim, size_t align,
                             size_t floor_claim, size_t tail_claim)
    : claims_(plan.size()), progress_(plan.size()), align_(std::max<size_t>(1, align)) {
  double largest = 0;
  for (const auto& share : plan) {
    pools_.push_back({share.offset, share.offset + share.count});
    weights_.push_back(static_cast<double>(share.count));
    largest = std::max(largest, static_cast<double>(share.count));
  }
  const size_t top = std::max(min_claim, align_);
  const size_t floor = std::min(top, std::max(floor_claim, align_));
  const size_t tail_top = std::clamp(tail_claim == 0 ? top : tail_claim, floor, top);
  for (double w : weights_) {
    const double share = largest > 0 ? w / largest : 1.0;
    min_claim_.push_back(std::clamp(round_up(static_cast<size_t>(static_cast<double>(top) * share)), floor, top));
    tail_claim_.push_back(
        std::clamp(round_up(static_cast<size_t>(static_cast<double>(tail_top) * share)), floor, min_claim_.back()));
  }
}

size_t ShareBalancer::half_of_own(size_t left, size_t min) const {
  if (left < 2 * min) return left;
  return std::min(left, std::max(round_up(left / 2), min));
}

double ShareBalancer::rate(size_t part, size_t finished, std::chrono::steady_clock::time_point at) const {
  const Progress& p = progress_[part];
  const double secs = std::chrono::duration<double>(at - p.first).count();
  return p.claims > 0 && finished > 0 && secs > 0 ? static_cast<double>(finished) / secs : 0;
}

ShareBalancer::Range ShareBalancer::claim(size_t part, std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Range r;
  Progress& mine = progress_[part];
  mine.finished = mine.claimed;  // its previous range ended: that is why it claims
  if (mine.claims == 0) mine.first = now;
  mine.last = now;
  Pool& own = pools_[part];
  const size_t min = min_claim_[part];
  const size_t tail = tail_claim_[part];
  if (own.begin < own.end) {
    const size_t left = own.end - own.begin;
    r = {own.begin, half_of_own(left, left < 2 * min ? tail : min)};
    own.begin += r.count;
  } else {
    // The share with the most time left at its planned rate (the lowest part on ties, so the choice
    // depends on the pool only); its back end, away from where its own rail is working.
    size_t victim = pools_.size();
    double most = -1;
    for (size_t p = 0; p < pools_.size(); ++p) {
      const size_t left = pools_[p].end - pools_[p].begin;
      if (left == 0) continue;
      const double time = static_cast<double>(left) / std::max(weights_[p], 1.0);
      if (time > most) {
        most = time;
        victim = p;
      }
    }
    if (victim == pools_.size()) return {};
    Pool& v = pools_[victim];
    const size_t left = v.end - v.begin;
    double ours = rate(part, mine.finished, now), theirs = rate(victim, progress_[victim].finished, progress_[victim].last);
    if (ours <= 0 || theirs <= 0) {  // one of them has no finished range yet: the plan's view
      ours = weights_[part];
      theirs = weights_[victim];
    }
    const double fraction = ours + theirs > 0 ? ours / (ours + theirs) : 0.5;
    // The thief takes at least its tail minimum and leaves the victim at least the victim's (a
    // remnant below it would be a range too small: an alltoall's pieces unpaced), or takes all of it.
    const size_t victim_tail = tail_claim_[victim];
    const size_t want = static_cast<size_t>(static_cast<double>(left) * fraction);
    const size_t take = left < tail + victim_tail ? left : std::clamp(round_up(want), tail, left - victim_tail);
    size_t keep = std::min(left, round_up(left - take));  // the range starts aligned
    r = {v.begin + keep, left - keep};
    v.end = v.begin + keep;
  }
  if (r.count > 0) {
    ++mine.claims;
    mine.claimed += r.count;
  }
  claims_[part].push_back(r);
  return r;
}

std::vector<ShareBalancer::Range> ShareBalancer::claimed(size_t part) const {
  std::lock_guard<std::mutex> lock(mu_);
  return claims_[part];
}

}  // namespace nezha::engine
