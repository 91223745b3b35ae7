// allreduce(): a rail that reduces in the network (collective_rail.h) and takes this dtype, op and
// size runs the share itself; otherwise pick the algorithm by payload size. Log-step needs log2(n)
// rounds of the whole payload (latency-bound small messages win); the ring moves 2(n-1)/n of it in
// 2(n-1) rounds (bandwidth-bound large messages win).
#include <cstring>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "transport/collective_rail.h"

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

bool detail::allreduce_in_network(transport::Rail& rail, void* buf, size_t count, DataType dtype,
                                  ReduceOp op, const CollectiveOptions& opt) {
  transport::CollectiveRail* coll = rail.collective();
  const size_t bytes = count * dtype_size(dtype);
  if (!coll || !coll->reduces(dtype, op) || (coll->max_share_bytes() && bytes > coll->max_share_bytes()))
    return false;
  // The aggregator's sums land over the input chunk by chunk: the rail hands each chunk's range to
  // before_overwrite (failover keeps it) just before its sum arrives, not the whole share up front.
  coll->start_allreduce(buf, buf, count, dtype, op, opt.seq, opt.before_overwrite)->wait(opt.deadline);
  if (opt.postscale != 1.0 && count > 0) scale(buf, count, dtype, opt.postscale);
  return true;
}

void detail::copy_input(const void* in, void* out, size_t bytes) {
  if (in != out && bytes > 0) std::memcpy(out, in, bytes);
}

void allreduce(transport::Rail& rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
               const CollectiveOptions& opt) {
  const bool ring = count * dtype_size(dtype) > opt.logstep_max_bytes;
  if (ring && !rail.collective() && rail.properties().point_to_point) {
    allreduce_ring(rail, in, out, count, dtype, op, opt);
    return;
  }
  // In place from here. The copy is not announced to before_overwrite: it writes the input itself.
  detail::copy_input(in, out, count * dtype_size(dtype));
  if (detail::allreduce_in_network(rail, out, count, dtype, op, opt)) return;
  if (!rail.properties().point_to_point)
    throw InvalidArgument("rail '" + rail.properties().name + "' cannot run an allreduce of " +
                          dtype_name(dtype) + " with " + reduce_op_name(op) + " (collective-only, and it "
                          "does not reduce this dtype/op or size)");
  if (ring) {
    allreduce_ring(rail, out, count, dtype, op, opt);
  } else {
    allreduce_logstep(rail, out, count, dtype, op, opt);
  }
}

}  // namespace nezha::collectives
