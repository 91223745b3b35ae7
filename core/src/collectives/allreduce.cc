// allreduce(): on a point-to-point rail, pick the algorithm by payload size. Log-step needs log2(n)
// rounds of the whole payload (latency-bound small messages win); halving/doubling moves 2(n-1)/n
// of it in 2 log2(n) rounds (mid-size: the bytes count, and so do the ring's extra rounds); the ring
// moves as much in 2(n-1) rounds, pipelined (large messages: it keeps every link busy while it
// reduces). A collective rail (collective_rail.h) runs the share itself.
#include <cstring>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "transport/collective_rail.h"

namespace nezha::collectives {

bool detail::allreduce_alone(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype,
                             const CollectiveOptions& opt) {
  if (rail.size() != 1) return false;
  if (opt.postscale != 1.0 && count > 0) {
    if (opt.before_overwrite) opt.before_overwrite(0, count * dtype_size(dtype));
    scale(buf, count, dtype, opt.postscale);
  }
  return true;
}

void detail::copy_input(const void* in, void* out, size_t bytes) {
  if (in != out && bytes > 0) std::memcpy(out, in, bytes);
}

void allreduce(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, const CollectiveOptions& opt) {
  const size_t bytes = count * dtype_size(dtype);
  if (bytes > opt.logstep_max_bytes && bytes <= opt.halving_max_bytes) {
    allreduce_halving(rail, in, out, count, dtype, op, opt);
    return;
  }
  if (bytes > opt.logstep_max_bytes) {
    allreduce_ring(rail, in, out, count, dtype, op, opt);
    return;
  }
  // In place from here. The copy is not announced to before_overwrite: it writes the input itself.
  detail::copy_input(in, out, count * dtype_size(dtype));
  allreduce_logstep(rail, out, count, dtype, op, opt);
}

void allreduce(transport::CollectiveRail& rail, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, const CollectiveOptions& opt) {
  if (!rail.takes(dtype, op, count * dtype_size(dtype)))
    throw InvalidArgument("rail '" + rail.properties().name + "' cannot run an allreduce of " +
                          std::to_string(count) + " " + dtype_name(dtype) + " with " + reduce_op_name(op) +
                          " (a collective rail, and it does not reduce this dtype/op or size)");
  detail::copy_input(in, out, count * dtype_size(dtype));
  // The aggregator's sums land over the input chunk by chunk: the rail hands each chunk's range to
  // before_overwrite (failover keeps it) just before its sum arrives, not the whole share up front.
  rail.start_allreduce(out, out, count, dtype, op, opt.seq, opt.before_overwrite)->wait(opt.deadline);
  if (opt.postscale != 1.0 && count > 0) scale(out, count, dtype, opt.postscale);
}

}  // namespace nezha::collectives
