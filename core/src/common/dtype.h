// Element types and reduction operators shared by every layer. The numeric values are part of the
// wire protocol (they travel in negotiation messages) and are exposed to Python by the bindings, so
// never renumber them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace nezha {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  kInt16 = 9,  // appended: the values above are on the wire
  kUInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,  // reduced as kSum; the engine folds 1/size into the postscale factor
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
constexpr int kNumReduceOps = 5;

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);
const char* reduce_op_name(ReduceOp op);
bool is_valid_dtype(int raw);
bool is_valid_reduce_op(int raw);
bool is_floating(DataType t);

}  // namespace nezha
