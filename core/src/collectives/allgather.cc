// Ring allgatherv: each rank's block travels n-1 hops around the ring, segmented like the ring
// allreduce. Per-rank sizes may differ and may be zero.
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void allgatherv_blocks(transport::PointToPointRail& rail, const void* in, const std::vector<uint8_t*>& out_blocks,
                       const std::vector<size_t>& bytes_per_rank, const CollectiveOptions& opt) {
  const int n = rail.size();
  const int r = rail.rank();
  detail::require(bytes_per_rank.size() == static_cast<size_t>(n) && out_blocks.size() == static_cast<size_t>(n),
                  "allgatherv: " + std::to_string(bytes_per_rank.size()) + " block sizes and " +
                      std::to_string(out_blocks.size()) + " blocks given for " + std::to_string(n) +
                      " ranks");
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    total += bytes_per_rank[i];
    detail::require(out_blocks[i] != nullptr || bytes_per_rank[i] == 0,
                    "allgatherv: null output block " + std::to_string(i));
  }
  if (total == 0) return;
  detail::require(in != nullptr || bytes_per_rank[r] == 0, "allgatherv: null input buffer");
  // memmove: `in` may be this rank's own block of the output (then this copies nothing new).
  if (bytes_per_rank[r] > 0 && in != out_blocks[r]) std::memmove(out_blocks[r], in, bytes_per_rank[r]);
  detail::TagSequence tags(opt.seq);
  detail::ring_allgather_blocks(rail, out_blocks, bytes_per_rank, opt.segment_bytes, tags, opt.deadline);
}

void allgatherv(transport::PointToPointRail& rail, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank, const CollectiveOptions& opt) {
  detail::require(bytes_per_rank.size() == static_cast<size_t>(rail.size()),
                  "allgatherv: " + std::to_string(bytes_per_rank.size()) +
                      " block sizes given for " + std::to_string(rail.size()) + " ranks");
  detail::require(out != nullptr || detail::prefix_offsets(bytes_per_rank).back() == 0,
                  "allgatherv: null output buffer");
  allgatherv_blocks(rail, in, detail::block_addresses(static_cast<uint8_t*>(out), bytes_per_rank),
                    bytes_per_rank, opt);
}

}  // namespace nezha::collectives
