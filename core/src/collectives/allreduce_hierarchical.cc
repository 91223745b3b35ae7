// allreduce_hierarchical(): reduce-scatter inside each host over its lane, allreduce of each slice
// across hosts among its owners over the network rail, allgather inside each host (slice ownership
// and why every rank gets the same bits: hierarchy.h).
#include <algorithm>
#include <cstdint>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/hierarchy.h"
#include "collectives/reduce.h"
#include "transport/collective_rail.h"
#include "transport/group_rail.h"

namespace nezha::collectives {

void allreduce_hierarchical(transport::Rail& host_lane, transport::PointToPointRail& network,
                            const transport::HostPlacement& placement, void* buf, size_t count, DataType dtype,
                            ReduceOp op, const CollectiveOptions& opt) {
  detail::require(static_cast<int>(placement.host_of_rank.size()) == network.size(),
                  "allreduce_hierarchical: placement of " + std::to_string(placement.host_of_rank.size()) +
                      " ranks for a rail of " + std::to_string(network.size()));
  transport::PointToPointRail* p2p_lane = host_lane.as_point_to_point();
  transport::CollectiveRail* coll_lane = host_lane.as_collective();
  detail::require(p2p_lane || coll_lane, "allreduce_hierarchical: the lane '" + host_lane.properties().name +
                                             "' is neither point to point nor collective");
  if (placement.hosts() == 1) {  // one host: the lane reaches every rank
    if (p2p_lane) allreduce(*p2p_lane, buf, count, dtype, op, opt);
    else allreduce(*coll_lane, buf, buf, count, dtype, op, opt);
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

  const bool shared_host = plan.local_ranks.size() > 1;
  const size_t mine = static_cast<size_t>(plan.local_index);
  std::vector<uint8_t*> block_at(plan.block_count.size());
  for (size_t l = 0; l < block_at.size(); ++l) block_at[l] = data + plan.block_offset[l] * esize;
  if (shared_host) {
    if (coll_lane) {
      detail::require(coll_lane->size() == static_cast<int>(plan.local_ranks.size()) &&
                          coll_lane->rank() == plan.local_index,
                      "allreduce_hierarchical: the collective lane '" + host_lane.properties().name + "' has rank " +
                          std::to_string(coll_lane->rank()) + " of " + std::to_string(coll_lane->size()) +
                          " where this host has " + std::to_string(plan.local_ranks.size()) + " ranks");
      // In place: the rail reads each piece of this rank's block before it writes that piece.
      reducescatterv_blocks(*coll_lane, std::vector<const uint8_t*>(block_at.begin(), block_at.end()), block_at,
                            plan.block_count, dtype, op, inner);
    } else {
      transport::GroupRail lane(*p2p_lane, plan.local_ranks);
      reducescatterv(lane, data, block_at[mine], plan.block_count, dtype, op, inner);
    }
  }

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
    if (coll_lane) {
      allgatherv(*coll_lane, block_at[mine], data, bytes, inner);
    } else {
      transport::GroupRail lane(*p2p_lane, plan.local_ranks);
      allgatherv(lane, block_at[mine], data, bytes, inner);
    }
  }
}

}  // namespace nezha::collectives
