// allreduce(): pick the algorithm by payload size. Log-step needs log2(n) rounds of the whole
// payload (latency-bound small messages win); the ring moves 2(n-1)/n of it in 2(n-1) rounds
// (bandwidth-bound large messages win).
#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace nezha::collectives {

bool detail::allreduce_alone(transport::Rail& rail, void* buf, size_t count, DataType dtype,
                             const CollectiveOptions& opt) {
  if (rail.size() != 1) return false;
  if (opt.postscale != 1.0 && count > 0) {
    if (opt.before_overwrite) opt.before_overwrite(0, count * dtype_size(dtype));
    scale(buf, count, dtype, opt.postscale);
  }
  return true;
}

void allreduce(transport::Rail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
               const CollectiveOptions& opt) {
  if (count * dtype_size(dtype) <= opt.logstep_max_bytes) {
    allreduce_logstep(rail, buf, count, dtype, op, opt);
  } else {
    allreduce_ring(rail, buf, count, dtype, op, opt);
  }
}

}  // namespace nezha::collectives
