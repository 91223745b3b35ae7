// The CUDA reduction kernels' calling convention, shared by the kernels (reduce_kernels.cu, nvcc)
// and the host code that launches them (reduce_module.cc, the C++ compiler): one struct passed by
// value, and the kernel names cuModuleGetFunction looks up.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace nezha::cuda {

// Most ranks one reduction reads (the ranks of one host sharing a GPU or its peers).
constexpr int kMaxReduceRanks = 16;

// dst[i] = srcs[0][i] (op) ... (op) srcs[ranks-1][i], then x scale when scale != 1, for i < count.
// dst may be one of the sources (each element is read from every source before it is written).
struct ReduceArgs {
  uint64_t srcs[kMaxReduceRanks];  // device addresses, in rank order
  uint64_t dst;
  uint64_t count;                  // elements
  double scale;                    // 1: none
  int32_t ranks;
  int32_t vectorised;              // every address 16-byte aligned: 16-byte loads and stores
};

// "nezha_reduce_<dtype>_<op>": the kernel for a dtype and op (Average: the Sum kernel, scaled).
inline const char* kernel_dtype_tag(DataType t) {
  switch (t) {
    case DataType::kUInt8: return "u8";
    case DataType::kInt8: return "i8";
    case DataType::kInt16: return "i16";
    case DataType::kUInt16: return "u16";
    case DataType::kInt32: return "i32";
    case DataType::kInt64: return "i64";
    case DataType::kFloat16: return "f16";
    case DataType::kBFloat16: return "bf16";
    case DataType::kFloat32: return "f32";
    case DataType::kFloat64: return "f64";
    case DataType::kBool: return "bool";
  }
  return "?";
}

inline const char* kernel_op_tag(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "prod";
  }
  return "?";
}

}  // namespace nezha::cuda
