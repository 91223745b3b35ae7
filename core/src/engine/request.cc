#include "engine/request.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "collectives/half_convert.h"
#include "common/error.h"

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

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu: return "CPU";
    case Device::kGpu: return "GPU";
  }
  return "unknown";
}

double half_precision_factor(double factor) {
  const float f = static_cast<float>(factor);
  uint16_t half = 0;
  float back = 0;
  collectives::float16_portable_converters().narrow(&f, &half, 1);
  collectives::float16_portable_converters().widen(&half, &back, 1);
  return back;
}

void scale_as_on_gpu(Response& r, int size) {
  if (r.dtype != DataType::kFloat16) return;
  r.postscale = half_precision_factor(effective_postscale(r, size));
  r.prescale = half_precision_factor(r.prescale);
  if (r.op == ReduceOp::kAverage) r.op = ReduceOp::kSum;
}

bool Request::same_metadata(const Request& o) const {
  return type == o.type && name == o.name && dtype == o.dtype && shape == o.shape && op == o.op &&
         prescale == o.prescale && postscale == o.postscale && root == o.root &&
         splits == o.splits && group == o.group && group_size == o.group_size &&
         process_set == o.process_set && device == o.device;
}

void Request::check_scaling() const {
  if (type != OpType::kAllreduce && type != OpType::kReducescatter) return;
  std::ostringstream why;
  if (dtype == DataType::kBool && (op == ReduceOp::kAverage || prescale != 1.0 || postscale != 1.0)) {
    why << "bool tensors cannot be averaged or scaled (prescale " << prescale << ", postscale " << postscale
        << "); use Sum, Min or Max";
  } else if (!is_floating(dtype) && !(std::isfinite(prescale) && std::isfinite(postscale))) {
    why << "integer tensors need finite scale factors (prescale " << prescale << ", postscale " << postscale
        << ")";
  } else {
    return;
  }
  throw InvalidArgument(std::string(op_type_name(type)) + " of tensor '" + name + "' (" + dtype_name(dtype) +
                        "): " + why.str());
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

size_t scaled_unfused_bytes(size_t unfused_bytes, const std::vector<multirail::RailEstimate>& estimates) {
  if (unfused_bytes == 0) return 0;
  const multirail::RailEstimate* fastest = nullptr;
  for (const auto& e : estimates)
    if (e.known() && (!fastest || e.beta_gbps > fastest->beta_gbps)) fastest = &e;
  return fastest ? std::max(unfused_bytes, multirail::amortized_range_bytes(*fastest)) : unfused_bytes;
}

}  // namespace nezha::engine
