// Ring allgatherv: each rank's block travels n-1 hops around the ring, segmented like the ring
// allreduce. Per-rank sizes may differ and may be zero.
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void allgatherv(transport::Rail& rail, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank, const CollectiveOptions& opt) {
  const int n = rail.size();
  const int r = rail.rank();
  detail::require(bytes_per_rank.size() == static_cast<size_t>(n),
                  "allgatherv: " + std::to_string(bytes_per_rank.size()) +
                      " block sizes given for " + std::to_string(n) + " ranks");
  const std::vector<size_t> offsets = detail::prefix_offsets(bytes_per_rank);
  if (offsets.back() == 0) return;
  detail::require(out != nullptr, "allgatherv: null output buffer");
  detail::require(in != nullptr || bytes_per_rank[r] == 0, "allgatherv: null input buffer");

  auto* dst = static_cast<uint8_t*>(out);
  // memmove: `in` may be this rank's own slot of `out` (then this copies nothing new).
  if (bytes_per_rank[r] > 0 && in != dst + offsets[r]) {
    std::memmove(dst + offsets[r], in, bytes_per_rank[r]);
  }
  detail::TagSequence tags(opt.seq);
  detail::ring_allgather(rail, dst, bytes_per_rank, opt.segment_bytes, tags, opt.deadline);
}

}  // namespace nezha::collectives
