// One element of a reduction over ranks, for code that reduces element by element rather than
// buffer by buffer: the CUDA kernels (core/src/cuda/reduce_kernels.cu) and their CPU unit test.
//
// reduce_ranks<D, O>(srcs, n, i) is srcs[0][i] (op) srcs[1][i] (op) ... srcs[n-1][i], left to right
// in rank order, with exactly the CPU kernels' arithmetic (collectives/reduce_ops.h, the same
// operator structs): integers wrap, Min/Max keep the left operand when either is NaN, float16 and
// bfloat16 are widened to float32 for each step and rounded back after it (as reduce_into does for
// each rank it adds), bool is a logical or (Sum, Max) or and (Min, Product). So a GPU reduction in
// rank order gives the bits of the CPU's serial rank-order reduction, on every rank.
//
// scale_element<D>(v, factor) is collectives::scale()'s arithmetic for one element (the engine's
// postscale, 1/size for Average): float32 x float(factor), float64 x factor, float16/bfloat16 in
// float32, integers in double, truncated toward zero and saturated. Callers skip it for factor 1.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "collectives/half.h"
#include "collectives/reduce_ops.h"
#include "common/dtype.h"
#include "common/host_device.h"

namespace nezha::collectives::element {

// Storage of one element of dtype D, and how a reduction step combines two of them.
template <DataType D> struct Storage;
template <> struct Storage<DataType::kUInt8> { using type = uint8_t; };
template <> struct Storage<DataType::kInt8> { using type = int8_t; };
template <> struct Storage<DataType::kInt16> { using type = int16_t; };
template <> struct Storage<DataType::kUInt16> { using type = uint16_t; };
template <> struct Storage<DataType::kInt32> { using type = int32_t; };
template <> struct Storage<DataType::kInt64> { using type = int64_t; };
template <> struct Storage<DataType::kFloat32> { using type = float; };
template <> struct Storage<DataType::kFloat64> { using type = double; };
template <> struct Storage<DataType::kFloat16> { using type = uint16_t; };
template <> struct Storage<DataType::kBFloat16> { using type = uint16_t; };
template <> struct Storage<DataType::kBool> { using type = uint8_t; };

template <DataType D>
using StorageT = typename Storage<D>::type;

// The operator struct reduce_into applies for (D, O); Average reduces as Sum.
template <DataType D, ReduceOp O>
struct OperatorFor {
  using type = ops::Sum;
};
template <DataType D> struct OperatorFor<D, ReduceOp::kMin> { using type = ops::Min; };
template <DataType D> struct OperatorFor<D, ReduceOp::kMax> { using type = ops::Max; };
template <DataType D> struct OperatorFor<D, ReduceOp::kProduct> { using type = ops::Product; };
template <> struct OperatorFor<DataType::kBool, ReduceOp::kSum> { using type = ops::LogicalOr; };
template <> struct OperatorFor<DataType::kBool, ReduceOp::kAverage> { using type = ops::LogicalOr; };
template <> struct OperatorFor<DataType::kBool, ReduceOp::kMax> { using type = ops::LogicalOr; };
template <> struct OperatorFor<DataType::kBool, ReduceOp::kMin> { using type = ops::LogicalAnd; };
template <> struct OperatorFor<DataType::kBool, ReduceOp::kProduct> { using type = ops::LogicalAnd; };

// acc (op) x, one reduction step.
template <DataType D, ReduceOp O>
NEZHA_HOST_DEVICE inline StorageT<D> combine(StorageT<D> acc, StorageT<D> x) {
  using Op = typename OperatorFor<D, O>::type;
  if constexpr (D == DataType::kFloat16) {
    return float_to_half(Op::apply(half_to_float(acc), half_to_float(x)));
  } else if constexpr (D == DataType::kBFloat16) {
    return float_to_bfloat16(Op::apply(bfloat16_to_float(acc), bfloat16_to_float(x)));
  } else {
    return Op::apply(acc, x);
  }
}

// srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[n-1][i], in rank order; n >= 1.
template <DataType D, ReduceOp O>
NEZHA_HOST_DEVICE inline StorageT<D> reduce_ranks(const StorageT<D>* const* srcs, int n, size_t i) {
  StorageT<D> acc = srcs[0][i];
  for (int r = 1; r < n; ++r) acc = combine<D, O>(acc, srcs[r][i]);
  return acc;
}

template <DataType D>
NEZHA_HOST_DEVICE inline StorageT<D> scale_element(StorageT<D> v, double factor) {
  using T = StorageT<D>;
  if constexpr (D == DataType::kFloat32) {
    return v * static_cast<float>(factor);
  } else if constexpr (D == DataType::kFloat64) {
    return v * factor;
  } else if constexpr (D == DataType::kFloat16) {
    return float_to_half(half_to_float(v) * static_cast<float>(factor));
  } else if constexpr (D == DataType::kBFloat16) {
    return float_to_bfloat16(bfloat16_to_float(v) * static_cast<float>(factor));
  } else if constexpr (D == DataType::kBool) {
    return v;  // never scaled: the lane refuses Average and postscale for bool, as scale() does
  } else {
    constexpr double kLow = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double kHighExclusive = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
    const double s = ::trunc(static_cast<double>(v) * factor);
    return s < kLow ? std::numeric_limits<T>::min()
           : s >= kHighExclusive ? std::numeric_limits<T>::max()
                                 : static_cast<T>(s);
  }
}

}  // namespace nezha::collectives::element
