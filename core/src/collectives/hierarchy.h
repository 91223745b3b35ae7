// The hierarchical allreduce's slice ownership (allreduce_hierarchical.cc), as a pure plan.
//
// Design. A buffer is cut into S = (most ranks on one host) slices, cache-line aligned. On a host
// with L ranks, local rank l owns the slices j with floor(j * L / S) == l: a contiguous run, at least
// one each, all S when L == 1. Slice j is allreduced across hosts by its owners, one per host (host
// order), so a host with fewer ranks takes part in several cross-host groups: with 3 + 1 ranks, the
// lone rank is in the groups of slices 0, 1 and 2, each beside one rank of the other host. Every rank
// runs its slices in ascending j; two groups that share ranks are entered in the same order by all of
// them, so the cross-host phase cannot deadlock (by induction on j). Each element is reduced along
// one path: inside its host by the ring reduce-scatter (once, by one rank), across hosts by its
// slice's group (bit-identical among the owners), then copied to every rank by the allgather. So
// every rank gets the same bits.
//
// Interleaving. Where a rank owns several slices (a host with fewer ranks), its peers in the later
// groups would sit silent while it serves the earlier ones, and a rail that moves nothing for
// NEZHA_RAIL_STALL_MS is failed over. So the cross-host phase then walks the slices in chunks:
// chunk 0 of each owned slice in slice order, then chunk 1, ... (every rank in the same global order
// (chunk, slice), so the no-deadlock argument above holds). A waiting rank then waits for a few
// chunks, not for whole slices.
#pragma once

#include <cstddef>
#include <vector>

#include "transport/host_lane.h"

namespace nezha::collectives {

struct HierarchicalPlan {
  std::vector<int> local_ranks;       // job ranks on this rank's host, ascending (group rank order)
  int local_index = 0;                // this rank's index in local_ranks
  std::vector<size_t> slice_offset;   // S + 1 element offsets (the last: count)
  std::vector<size_t> block_count;    // per local rank: elements of its run of slices
  std::vector<size_t> block_offset;   // per local rank: first element of its run
  std::vector<int> my_slices;         // slices this rank owns, ascending
  std::vector<std::vector<int>> group_of_slice;  // per slice: its owners, one per host, host order
  bool interleave = false;            // some rank owns several slices (see Interleaving above)
};

// Every rank computes the same slices and groups from the same placement.
HierarchicalPlan plan_hierarchical(const transport::HostPlacement& placement, int rank, size_t count,
                                   size_t elem_size);

}  // namespace nezha::collectives
