// Pipelined ring allreduce: reduce-scatter then allgather over blocks of (almost) equal size, each
// starting on a cache line.
#include <cstdint>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void allreduce_ring(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype,
                    ReduceOp op, const CollectiveOptions& opt) {
  const size_t esize = dtype_size(dtype);
  detail::require((in != nullptr && out != nullptr) || count == 0, "allreduce_ring: null buffer");
  if (count == 0) return;
  if (rail.size() == 1) {
    detail::copy_input(in, out, count * esize);
    detail::allreduce_alone(rail, out, count, dtype, opt);
    return;
  }

  const std::vector<size_t> counts = detail::cache_line_partition(count, rail.size(), esize);
  std::vector<size_t> block_bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) block_bytes[i] = counts[i] * esize;
  const size_t segment_elems = detail::segment_elements(opt.segment_bytes, esize);

  // Out of place, step 0 sends this rank's input and each block's sum lands in `out` (reduce_to):
  // every byte of `out` is written once with its result, none copied from `in` first.
  auto* bytes = static_cast<uint8_t*>(out);
  const std::vector<uint8_t*> blocks = detail::block_addresses(bytes, block_bytes);
  std::vector<const uint8_t*> inputs(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) inputs[i] = static_cast<const uint8_t*>(in) + (blocks[i] - bytes);
  detail::TagSequence tags(opt.seq);
  const detail::OverwriteHook* hook = opt.before_overwrite ? &opt.before_overwrite : nullptr;
  detail::ring_reduce_scatter_blocks(rail, inputs, blocks, counts, dtype, op, segment_elems, tags, opt.deadline,
                                     hook, bytes, opt.postscale);
  detail::ring_allgather(rail, bytes, block_bytes, segment_elems * esize, tags, opt.deadline, hook);
}

}  // namespace nezha::collectives
