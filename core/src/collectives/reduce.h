// Elementwise reduction and scaling kernels, one per dtype x op (reduce_*.cc). float16 and bfloat16
// are computed in float32 and rounded once per call (round-to-nearest-even), like NCCL's CPU path.
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace nezha::collectives {

// dst[i] = dst[i] (op) src[i] for i < count. kAverage reduces as kSum (the caller scales).
// bool: Sum/Max = logical or, Min/Product = logical and.
void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, as Horovod scales: float32/float64 in their own type (the factor rounded to it),
// float16/bfloat16 in float32, integers in double rounded toward zero; no-op for factor == 1.
// Throws InvalidArgument for bool with factor != 1.
void scale(void* buf, size_t count, DataType dtype, double factor);

}  // namespace nezha::collectives
