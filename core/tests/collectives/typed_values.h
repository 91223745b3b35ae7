// Store/load test values of any dtype as double, so the algorithm tests can build inputs and compare
// with a serial reference written once. Tests use small integers, which every dtype (float16
// included) represents exactly, so the reference is exact whatever order an algorithm reduces in.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/half.h"
#include "common/dtype.h"

namespace nezha::testing {

inline void store_value(DataType dtype, void* buf, size_t i, double v) {
  switch (dtype) {
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case DataType::kInt16: static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(v); break;
    case DataType::kUInt16: static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(v); break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = collectives::float_to_half(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = collectives::float_to_bfloat16(static_cast<float>(v));
      break;
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DataType::kBool: static_cast<uint8_t*>(buf)[i] = v != 0; break;
  }
}

inline double load_value(DataType dtype, const void* buf, size_t i) {
  switch (dtype) {
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(buf)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kFloat16: return collectives::half_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16:
      return collectives::bfloat16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kBool: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

// Rank r's input element i: a small integer in [-3, 3] (or [0, 3] / {0, 1} where the dtype needs
// it), different across ranks and positions.
inline double input_value(DataType dtype, int rank, size_t i) {
  const long long v = static_cast<long long>((rank * 5 + i * 3 + (i / 7)) % 7) - 3;
  if (dtype == DataType::kBool) return (rank + i) % 3 == 0;
  if (dtype == DataType::kUInt8 || dtype == DataType::kUInt16) return static_cast<double>(v + 3);
  return static_cast<double>(v);
}

inline double reference_op(ReduceOp op, DataType dtype, double a, double b) {
  if (dtype == DataType::kBool) {
    const bool is_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    return is_and ? (a != 0 && b != 0) : (a != 0 || b != 0);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return a + b;
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kProduct: return a * b;
  }
  return a;
}

// Serial reference: element i reduced over ranks 0..size-1 in rank order.
inline double reference_reduction(ReduceOp op, DataType dtype, int size, size_t i) {
  double acc = input_value(dtype, 0, i);
  for (int r = 1; r < size; ++r) acc = reference_op(op, dtype, acc, input_value(dtype, r, i));
  return acc;
}

inline std::vector<uint8_t> make_input(DataType dtype, int rank, size_t count) {
  std::vector<uint8_t> buf(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) store_value(dtype, buf.data(), i, input_value(dtype, rank, i));
  return buf;
}

}  // namespace nezha::testing
