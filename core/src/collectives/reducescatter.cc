// Ring reducescatterv: the reduce-scatter half of the ring allreduce with caller-chosen blocks.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void reducescatterv(transport::Rail& rail, void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype, ReduceOp op, const CollectiveOptions& opt) {
  const int n = rail.size();
  const int r = rail.rank();
  detail::require(counts.size() == static_cast<size_t>(n),
                  "reducescatterv: " + std::to_string(counts.size()) + " block counts given for " +
                      std::to_string(n) + " ranks");
  const size_t esize = dtype_size(dtype);
  const std::vector<size_t> offsets = detail::prefix_offsets(counts);
  if (offsets.back() == 0) return;
  detail::require(in != nullptr, "reducescatterv: null input buffer");
  detail::require(out != nullptr || counts[r] == 0, "reducescatterv: null output buffer");

  auto* data = static_cast<uint8_t*>(in);
  detail::TagSequence tags(opt.seq);
  detail::ring_reduce_scatter(rail, data, counts, dtype, op,
                              detail::segment_elements(opt.segment_bytes, esize), tags,
                              opt.deadline);
  const uint8_t* mine = data + offsets[r] * esize;
  if (counts[r] > 0 && out != mine) std::memmove(out, mine, counts[r] * esize);
}

}  // namespace nezha::collectives
