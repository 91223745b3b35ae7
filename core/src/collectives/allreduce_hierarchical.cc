// allreduce_hierarchical(): reduce-scatter inside each host over its lane, allreduce of each slice
// across hosts among its owners over the network rail, allgather inside each host (slice ownership
// and why every rank gets the same bits: hierarchy.h).
#include <algorithm>
#include <cstdint>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/hierarchy.h"
#include "collectives/reduce.h"
#include "transport/group_rail.h"

namespace nezha::collectives {

void allreduce_hierarchical(transport::PointToPointRail& host_lane, transport::PointToPointRail& network,
                            const transport::HostPlacement& placement, void* buf, size_t count, DataType dtype,
                            ReduceOp op, const CollectiveOptions& opt) {
  detail::require(static_cast<int>(placement.host_of_rank.size()) == network.size(),
                  "allreduce_hierarchical: placement of " + std::to_string(placement.host_of_rank.size()) +
                      " ranks for a rail of " + std::to_string(network.size()));
  if (placement.hosts() == 1) {  // one host: the lane reaches every rank
    allreduce(host_lane, buf, count, dtype, op, opt);
    return;
  }
  if (count == 0) return;
  const size_t esize = dtype_size(dtype);
  auto* data = static_cast<uint8_t*>(buf);
  const HierarchicalPlan plan = plan_hierarchical(placement, network.rank(), count, esize);
  // The three phases overwrite the share piecewise on different rails; a redo needs all of it.
  if (opt.before_overwrite) opt.before_overwrite(0, count * esize);
  CollectiveOptions inner = opt;
  inner.before_overwrite = nullptr;
  inner.postscale = 1.0;

  transport::GroupRail lane(host_lane, plan.local_ranks);
  const bool shared_host = lane.size() > 1;
  const size_t mine = static_cast<size_t>(plan.local_index);
  if (shared_host)
    reducescatterv(lane, data, data + plan.block_offset[mine] * esize, plan.block_count, dtype, op, inner);

  CollectiveOptions cross = inner;
  cross.postscale = opt.postscale;  // applied once per element, by its slice's owners
  std::vector<transport::GroupRail> groups;
  size_t longest = 0;
  for (int j : plan.my_slices) groups.emplace_back(network, plan.group_of_slice[j]);
  for (size_t j = 0; j + 1 < plan.slice_offset.size(); ++j)
    longest = std::max(longest, plan.slice_offset[j + 1] - plan.slice_offset[j]);
  // Whole slices, or chunk by chunk across the owned slices (hierarchy.h: Interleaving); every
  // member of a group sees the same slice length, so all skip or run the same chunks.
  const size_t chunk = plan.interleave ? std::max<size_t>(1, opt.segment_bytes / esize) : std::max<size_t>(1, longest);
  for (size_t begin = 0; begin < longest; begin += chunk) {
    for (size_t k = 0; k < plan.my_slices.size(); ++k) {
      const int j = plan.my_slices[k];
      const size_t n = plan.slice_offset[j + 1] - plan.slice_offset[j];
      if (begin >= n) continue;
      allreduce(groups[k], data + (plan.slice_offset[j] + begin) * esize, std::min(chunk, n - begin), dtype, op,
                cross);
    }
  }

  if (shared_host) {
    std::vector<size_t> bytes(plan.block_count.size());
    for (size_t l = 0; l < bytes.size(); ++l) bytes[l] = plan.block_count[l] * esize;
    allgatherv(lane, data + plan.block_offset[mine] * esize, data, bytes, inner);
  }
}

}  // namespace nezha::collectives
