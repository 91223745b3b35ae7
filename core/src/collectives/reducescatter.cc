// Ring reducescatterv: the reduce-scatter half of the ring allreduce with caller-chosen blocks.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {
namespace {

void require_counts(const transport::PointToPointRail& rail, size_t given) {
  detail::require(given == static_cast<size_t>(rail.size()),
                  "reducescatterv: " + std::to_string(given) + " block counts given for " +
                      std::to_string(rail.size()) + " ranks");
}

}  // namespace

void reducescatterv_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& in_blocks,
                           const std::vector<uint8_t*>& work_blocks, const std::vector<size_t>& counts,
                           DataType dtype, ReduceOp op, const CollectiveOptions& opt) {
  const int n = rail.size();
  require_counts(rail, counts.size());
  detail::require(in_blocks.size() == counts.size() && work_blocks.size() == counts.size(),
                  "reducescatterv: " + std::to_string(in_blocks.size()) + " input and " +
                      std::to_string(work_blocks.size()) + " work blocks given for " +
                      std::to_string(n) + " ranks");
  for (int i = 0; i < n; ++i) {
    detail::require((in_blocks[i] != nullptr && work_blocks[i] != nullptr) || counts[i] == 0,
                    "reducescatterv: null input or work block " + std::to_string(i));
  }
  if (n == 1) {  // the input is the result
    if (counts[0] > 0 && work_blocks[0] != in_blocks[0])
      std::memmove(work_blocks[0], in_blocks[0], counts[0] * dtype_size(dtype));
    return;
  }
  detail::TagSequence tags(opt.seq);
  detail::ring_reduce_scatter_blocks(rail, in_blocks, work_blocks, counts, dtype, op,
                                     detail::segment_elements(opt.segment_bytes, dtype_size(dtype)),
                                     tags, opt.deadline);
}

void reducescatterv(transport::PointToPointRail& rail, void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype, ReduceOp op, const CollectiveOptions& opt) {
  const int r = rail.rank();
  require_counts(rail, counts.size());
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
