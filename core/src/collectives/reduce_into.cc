// reduce_into(): dispatch once per call on (dtype, op) to a typed loop from reduce_ops.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/half_convert.h"
#include "collectives/reduce.h"
#include "collectives/reduce_ops.h"
#include "common/error.h"

namespace nezha::collectives {
namespace {

template <typename Op>
void reduce_typed(void* dst, const void* src, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return ops::apply_n<Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count);
    case DataType::kInt8:
      return ops::apply_n<Op>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count);
    case DataType::kInt16:
      return ops::apply_n<Op>(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count);
    case DataType::kUInt16:
      return ops::apply_n<Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
    case DataType::kInt32:
      return ops::apply_n<Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
    case DataType::kInt64:
      return ops::apply_n<Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
    case DataType::kFloat32:
      return ops::apply_n<Op>(static_cast<float*>(dst), static_cast<const float*>(src), count);
    case DataType::kFloat64:
      return ops::apply_n<Op>(static_cast<double*>(dst), static_cast<const double*>(src), count);
    case DataType::kFloat16:
      return ops::apply_n_via_float<Op>(static_cast<uint16_t*>(dst),
                                        static_cast<const uint16_t*>(src), count,
                                        float16_converters());
    case DataType::kBFloat16:
      return ops::apply_n_via_float<Op>(static_cast<uint16_t*>(dst),
                                        static_cast<const uint16_t*>(src), count,
                                        bfloat16_converters());
    case DataType::kBool:
      break;  // handled by reduce_bool
  }
  throw InvalidArgument("reduce_into: unknown dtype code " +
                        std::to_string(static_cast<int>(dtype)));
}

void reduce_bool(void* dst, const void* src, size_t count, ReduceOp op) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (op == ReduceOp::kMin || op == ReduceOp::kProduct) {
    ops::apply_n<ops::LogicalAnd>(d, s, count);
  } else {
    ops::apply_n<ops::LogicalOr>(d, s, count);
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (!is_valid_reduce_op(static_cast<int>(op))) {
    throw InvalidArgument("reduce_into: unknown reduce op code " +
                          std::to_string(static_cast<int>(op)));
  }
  if (count == 0) return;
  if (dtype == DataType::kBool) return reduce_bool(dst, src, count, op);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // the caller applies 1/size afterwards
      return reduce_typed<ops::Sum>(dst, src, count, dtype);
    case ReduceOp::kMin:
      return reduce_typed<ops::Min>(dst, src, count, dtype);
    case ReduceOp::kMax:
      return reduce_typed<ops::Max>(dst, src, count, dtype);
    case ReduceOp::kProduct:
      return reduce_typed<ops::Product>(dst, src, count, dtype);
  }
}

void reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  // A chunk of a is copied, then reduced while still in L1/L2: one pass over memory, and one
  // kernel per dtype x op instead of a second, three-operand family.
  constexpr size_t kChunkBytes = 32 << 10;
  const size_t esize = dtype_size(dtype);
  const size_t chunk = std::max<size_t>(1, kChunkBytes / esize);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t done = 0; done < count; done += chunk) {
    const size_t m = std::min(chunk, count - done);
    std::memcpy(d + done * esize, x + done * esize, m * esize);
    reduce_into(d + done * esize, y + done * esize, m, dtype, op);
  }
}

}  // namespace nezha::collectives
