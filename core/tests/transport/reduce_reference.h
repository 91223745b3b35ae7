// Test helper: inputs of every dtype that make rank order matter, and the serial rank-order reduction
// of them written here (the C++ type's own arithmetic; float16/bfloat16 through the kernel applied
// serially): the reference the shm collective rail's results are checked against bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/reduce.h"
#include "common/dtype.h"

namespace nezha::transport::testing {

// Values that make rank order matter for floats and stay in range for small integers' products.
inline double value(int rank, size_t i) { return static_cast<double>((i * 7 + rank * 13) % 5) + 0.1 * ((i + rank) % 3); }

template <class T>
std::vector<uint8_t> typed_input(int rank, size_t count) {
  std::vector<uint8_t> out(count * sizeof(T));
  for (size_t i = 0; i < count; ++i) {
    const T v = std::is_floating_point_v<T> ? static_cast<T>(value(rank, i))
                                            : static_cast<T>(static_cast<int>(value(rank, i)));
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

inline std::vector<uint8_t> input_of(DataType t, int rank, size_t count) {
  switch (t) {
    case DataType::kUInt8: return typed_input<uint8_t>(rank, count);
    case DataType::kInt8: return typed_input<int8_t>(rank, count);
    case DataType::kInt16: return typed_input<int16_t>(rank, count);
    case DataType::kUInt16: return typed_input<uint16_t>(rank, count);
    case DataType::kInt32: return typed_input<int32_t>(rank, count);
    case DataType::kInt64: return typed_input<int64_t>(rank, count);
    case DataType::kFloat32: return typed_input<float>(rank, count);
    case DataType::kFloat64: return typed_input<double>(rank, count);
    case DataType::kBool: {
      std::vector<uint8_t> out(count);
      for (size_t i = 0; i < count; ++i) out[i] = (i + static_cast<size_t>(rank)) % 3 != 0;
      return out;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {  // small integers and halves: exact in both formats
      std::vector<uint8_t> out(count * 2);
      for (size_t i = 0; i < count; ++i) {
        const float f = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 5) * 0.5f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint16_t half = t == DataType::kBFloat16 ? static_cast<uint16_t>(bits >> 16) : [&] {
          // float16 of a small exact value: sign 0, exponent and mantissa from the float's.
          if (f == 0) return uint16_t{0};
          const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
          return static_cast<uint16_t>((exp << 10) | ((bits >> 13) & 0x3ff));
        }();
        std::memcpy(out.data() + i * 2, &half, 2);
      }
      return out;
    }
  }
  return {};
}

template <class T>
T apply(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return static_cast<T>(a + b);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProduct: return static_cast<T>(a * b);
  }
  return a;
}

template <class T>
std::vector<uint8_t> typed_reference(const std::vector<std::vector<uint8_t>>& inputs, size_t count, ReduceOp op) {
  std::vector<uint8_t> out(count * sizeof(T));
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, inputs[0].data() + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < inputs.size(); ++r) {
      T v;
      std::memcpy(&v, inputs[r].data() + i * sizeof(T), sizeof(T));
      acc = apply(acc, v, op);
    }
    std::memcpy(out.data() + i * sizeof(T), &acc, sizeof(T));
  }
  return out;
}

inline std::vector<uint8_t> reference(DataType t, const std::vector<std::vector<uint8_t>>& inputs, size_t count, ReduceOp op) {
  switch (t) {
    case DataType::kUInt8: return typed_reference<uint8_t>(inputs, count, op);
    case DataType::kInt8: return typed_reference<int8_t>(inputs, count, op);
    case DataType::kInt16: return typed_reference<int16_t>(inputs, count, op);
    case DataType::kUInt16: return typed_reference<uint16_t>(inputs, count, op);
    case DataType::kInt32: return typed_reference<int32_t>(inputs, count, op);
    case DataType::kInt64: return typed_reference<int64_t>(inputs, count, op);
    case DataType::kFloat32: return typed_reference<float>(inputs, count, op);
    case DataType::kFloat64: return typed_reference<double>(inputs, count, op);
    case DataType::kBool: {
      std::vector<uint8_t> out(count);
      const bool any = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
      for (size_t i = 0; i < count; ++i) {
        bool acc = inputs[0][i] != 0;
        for (size_t r = 1; r < inputs.size(); ++r) acc = any ? (acc || inputs[r][i]) : (acc && inputs[r][i]);
        out[i] = acc;
      }
      return out;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {  // the kernel itself, serially in rank order
      std::vector<uint8_t> out = inputs[0];
      for (size_t r = 1; r < inputs.size(); ++r) collectives::reduce_into(out.data(), inputs[r].data(), count, t, op);
      return out;
    }
  }
  return {};
}

inline std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return "byte " + std::to_string(i);
  return "";
}

}  // namespace nezha::transport::testing
