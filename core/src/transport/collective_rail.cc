#include "transport/collective_rail.h"

#include "common/error.h"

namespace nezha::transport {

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kReducescatter: return "reducescatter";
    case CollectiveOp::kAlltoall: return "alltoall";
  }
  return "unknown collective";
}

void CollectiveRail::refuse(CollectiveOp op) const {
  throw InvalidArgument("rail '" + properties().name + "' (a collective rail of kind '" + properties().kind +
                        "') does not run " + collective_op_name(op) + "s; runs() says which it does");
}

std::unique_ptr<CollectiveRequest> CollectiveRail::start_broadcast(void*, size_t, int, uint64_t) {
  refuse(CollectiveOp::kBroadcast);
}

std::unique_ptr<CollectiveRequest> CollectiveRail::start_allgather(const void*, const std::vector<uint8_t*>&,
                                                                   const std::vector<size_t>&, uint64_t) {
  refuse(CollectiveOp::kAllgather);
}

std::unique_ptr<CollectiveRequest> CollectiveRail::start_reducescatter(const std::vector<const uint8_t*>&, void*,
                                                                       const std::vector<size_t>&, DataType,
                                                                       ReduceOp, uint64_t) {
  refuse(CollectiveOp::kReducescatter);
}

std::unique_ptr<CollectiveRequest> CollectiveRail::start_alltoall(const std::vector<const uint8_t*>&,
                                                                  const std::vector<uint8_t*>&,
                                                                  const std::vector<size_t>&, uint64_t) {
  refuse(CollectiveOp::kAlltoall);
}

}  // namespace nezha::transport
