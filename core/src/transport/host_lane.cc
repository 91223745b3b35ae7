#include "transport/host_lane.h"

#include <algorithm>

namespace nezha::transport {

int HostPlacement::hosts() const {
  int n = 0;
  for (int h : host_of_rank) n = std::max(n, h + 1);
  return n;
}

std::vector<int> HostPlacement::ranks_on(int host) const {
  std::vector<int> out;
  for (size_t r = 0; r < host_of_rank.size(); ++r)
    if (host_of_rank[r] == host) out.push_back(static_cast<int>(r));
  return out;
}

HostPlacement HostPlacement::from_keys(const std::vector<std::string>& keys) {
  HostPlacement p;
  std::vector<std::string> seen;
  for (const auto& k : keys) {
    auto it = std::find(seen.begin(), seen.end(), k);
    p.host_of_rank.push_back(static_cast<int>(it - seen.begin()));
    if (it == seen.end()) seen.push_back(k);
  }
  return p;
}

}  // namespace nezha::transport
