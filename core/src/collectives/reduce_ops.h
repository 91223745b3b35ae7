// Elementwise operators and the loops that apply them (private to the reduction kernels).
//
// Each loop is a plain indexed loop over restrict pointers with the operator inlined, so -O3
// vectorises it; the dtype/op switch happens once per call in reduce_into.cc, never per element.
// The operators are NEZHA_HOST_DEVICE: the CUDA kernels (collectives/element_reduce.h) apply the
// same ones, so a GPU reduction in rank order gives the CPU's bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "collectives/half_convert.h"
#include "common/host_device.h"

namespace nezha::collectives::ops {

// Integer sum/product wrap modulo 2^bits (like NumPy and PyTorch). Done in the unsigned type because
// signed overflow is undefined behaviour in C++.
template <typename T>
using Unsigned = std::make_unsigned_t<T>;

struct Sum {
  template <typename T>
  NEZHA_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct Product {
  template <typename T>
  NEZHA_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // Promote through unsigned int so uint8/int8 products cannot overflow a signed int.
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, Unsigned<T>>;
      return static_cast<T>(static_cast<U>(static_cast<Unsigned<T>>(a)) *
                            static_cast<U>(static_cast<Unsigned<T>>(b)));
    } else {
      return a * b;
    }
  }
};

// Min/Max have std::min/std::max semantics (as Gloo): if either operand is NaN the result is `a`.
// The algorithms always call them with a canonical operand order so results agree across ranks.
struct Min {
  template <typename T>
  NEZHA_HOST_DEVICE static T apply(T a, T b) { return b < a ? b : a; }
};

struct Max {
  template <typename T>
  NEZHA_HOST_DEVICE static T apply(T a, T b) { return a < b ? b : a; }
};

// bool is stored as one byte; any non-zero byte is true and results are normalised to 0/1.
struct LogicalOr {
  NEZHA_HOST_DEVICE static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};

struct LogicalAnd {
  NEZHA_HOST_DEVICE static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};

template <typename Op, typename T>
void apply_n(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], src[i]);
}

// float16/bfloat16: widen a chunk of both operands to float32, reduce, round back once. Chunks keep
// the working set in L1 and every inner loop simple enough to vectorise.
template <typename Op>
void apply_n_via_float(uint16_t* dst, const uint16_t* src, size_t n, const HalfArrayConverters& cvt) {
  constexpr size_t kChunk = 512;
  float a[kChunk];
  float b[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = std::min(kChunk, n - base);
    cvt.widen(dst + base, a, m);
    cvt.widen(src + base, b, m);
    apply_n<Op, float>(a, b, m);
    cvt.narrow(a, dst + base, m);
  }
}

}  // namespace nezha::collectives::ops
