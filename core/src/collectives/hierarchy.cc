#include "collectives/hierarchy.h"

#include <algorithm>

#include "collectives/algorithm_util.h"

namespace nezha::collectives {

HierarchicalPlan plan_hierarchical(const transport::HostPlacement& placement, int rank, size_t count,
                                   size_t elem_size) {
  HierarchicalPlan p;
  const int hosts = placement.hosts();
  std::vector<std::vector<int>> ranks_on(static_cast<size_t>(hosts));
  int slices = 1, fewest = static_cast<int>(placement.host_of_rank.size());
  for (int h = 0; h < hosts; ++h) {
    ranks_on[h] = placement.ranks_on(h);
    slices = std::max(slices, static_cast<int>(ranks_on[h].size()));
    fewest = std::min(fewest, static_cast<int>(ranks_on[h].size()));
  }
  p.interleave = fewest < slices;
  const int my_host = placement.host_of_rank.at(static_cast<size_t>(rank));
  p.local_ranks = ranks_on[my_host];
  p.local_index = static_cast<int>(std::find(p.local_ranks.begin(), p.local_ranks.end(), rank) - p.local_ranks.begin());
  p.slice_offset = detail::prefix_offsets(detail::cache_line_partition(count, slices, elem_size));
  const auto owner = [&](int host, int slice) {
    const size_t l = static_cast<size_t>(slice) * ranks_on[host].size() / static_cast<size_t>(slices);
    return ranks_on[host][l];
  };
  const size_t local = p.local_ranks.size();
  p.block_count.assign(local, 0);
  p.block_offset.assign(local, count);
  p.group_of_slice.resize(static_cast<size_t>(slices));
  for (int j = 0; j < slices; ++j) {
    for (int h = 0; h < hosts; ++h) p.group_of_slice[j].push_back(owner(h, j));
    const size_t l = static_cast<size_t>(j) * local / static_cast<size_t>(slices);
    p.block_offset[l] = std::min(p.block_offset[l], p.slice_offset[j]);
    p.block_count[l] += p.slice_offset[j + 1] - p.slice_offset[j];
    if (owner(my_host, j) == rank) p.my_slices.push_back(j);
  }
  return p;
}

}  // namespace nezha::collectives
