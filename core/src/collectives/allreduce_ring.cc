// Pipelined ring allreduce: reduce-scatter then allgather over blocks of (almost) equal size, each
// starting on a cache line.
#include <cstdint>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void allreduce_ring(transport::Rail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
                    const CollectiveOptions& opt) {
  const size_t esize = dtype_size(dtype);
  detail::require(buf != nullptr || count == 0, "allreduce_ring: null buffer");
  if (count == 0 || detail::allreduce_alone(rail, buf, count, dtype, opt)) return;

  const std::vector<size_t> counts = detail::cache_line_partition(count, rail.size(), esize);
  std::vector<size_t> block_bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) block_bytes[i] = counts[i] * esize;
  const size_t segment_elems = detail::segment_elements(opt.segment_bytes, esize);

  auto* bytes = static_cast<uint8_t*>(buf);
  detail::TagSequence tags(opt.seq);
  const detail::OverwriteHook* hook = opt.before_overwrite ? &opt.before_overwrite : nullptr;
  detail::ring_reduce_scatter(rail, bytes, counts, dtype, op, segment_elems, tags, opt.deadline, hook,
                              opt.postscale);
  detail::ring_allgather(rail, bytes, block_bytes, segment_elems * esize, tags, opt.deadline, hook);
}

}  // namespace nezha::collectives
