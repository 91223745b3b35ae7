#include "engine/execution/share_balancer.h"

#include <algorithm>

namespace nezha::engine {

ShareBalancer::ShareBalancer(const std::vector<multirail::RailShare>& plan, size_t min_claim, size_t align)
    : claims_(plan.size()), align_(std::max<size_t>(1, align)) {
  min_claim_ = std::max(min_claim, align_);
  for (const auto& share : plan) pools_.push_back({share.offset, share.offset + share.count});
}

size_t ShareBalancer::take_size(size_t left) const {
  if (left < 2 * min_claim_) return left;
  size_t half = (left / 2 + align_ - 1) / align_ * align_;  // rounded up to the alignment
  return std::min(left, std::max(half, min_claim_));
}

ShareBalancer::Range ShareBalancer::claim(size_t part) {
  std::lock_guard<std::mutex> lock(mu_);
  Range r;
  Pool& own = pools_[part];
  if (own.begin < own.end) {
    r = {own.begin, take_size(own.end - own.begin)};
    own.begin += r.count;
  } else {
    // The largest share still holding elements (the lowest part on ties, so the choice depends on
    // the pool only); its back end, away from where its own rail is working.
    size_t victim = pools_.size();
    for (size_t p = 0; p < pools_.size(); ++p)
      if (pools_[p].end - pools_[p].begin > 0 &&
          (victim == pools_.size() || pools_[p].end - pools_[p].begin > pools_[victim].end - pools_[victim].begin))
        victim = p;
    if (victim == pools_.size()) return {};
    Pool& v = pools_[victim];
    const size_t left = v.end - v.begin;
    size_t keep = left - take_size(left);
    keep = std::min(left, (keep + align_ - 1) / align_ * align_);  // the range starts aligned
    r = {v.begin + keep, left - keep};
    v.end = v.begin + keep;
  }
  claims_[part].push_back(r);
  return r;
}

std::vector<ShareBalancer::Range> ShareBalancer::claimed(size_t part) const {
  std::lock_guard<std::mutex> lock(mu_);
  return claims_[part];
}

}  // namespace nezha::engine
