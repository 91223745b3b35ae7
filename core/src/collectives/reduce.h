// Elementwise reduction and scaling kernels, one per dtype x op (reduce_*.cc). float16 and bfloat16
// are computed in float32 and rounded once per call (round-to-nearest-even), like NCCL's CPU path.
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace nezha::collectives {

// dst[i] = dst[i] (op) src[i] for i < count. kAverage reduces as kSum (the caller scales).
// bool: Sum/Max = logical or, Min/Product = logical and.
void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// dst[i] = a[i] (op) b[i]: reduce_into without first copying a whole input into dst (a striped
// reducescatter reads the caller's input and writes its sums elsewhere). Bit-identical to
// copying a into dst, then reduce_into(dst, b). dst must not overlap a or b.
void reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, as Horovod scales: float32/float64 in their own type (the factor rounded to it),
// float16/bfloat16 in float32, integers in double rounded toward zero; no-op for factor == 1.
// Throws InvalidArgument for bool with factor != 1.
void scale(void* buf, size_t count, DataType dtype, double factor);

}  // namespace nezha::collectives
