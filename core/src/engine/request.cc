#include "engine/request.h"

namespace nezha::engine {

const char* op_type_name(OpType t) {
  switch (t) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
  }
  return "unknown";
}

bool Request::same_metadata(const Request& o) const {
  return type == o.type && name == o.name && dtype == o.dtype && shape == o.shape && op == o.op &&
         prescale == o.prescale && postscale == o.postscale && root == o.root &&
         splits == o.splits && group == o.group && group_size == o.group_size;
}

int64_t Request::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Request::row_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

}  // namespace nezha::engine
