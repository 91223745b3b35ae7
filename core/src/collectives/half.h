// IEEE float16 and bfloat16 <-> float32 conversions for the reduction kernels.
//
// Why not _Float16 / __bf16: their availability and arithmetic support vary by compiler and target,
// and the wire format is plain uint16_t anyway. The code below is branch-free so the compiler
// vectorises the array loops with baseline SSE2; half_convert.h adds an F16C version chosen at run
// time. All paths round to nearest even and handle infinities, NaNs (returned quiet, sign kept) and
// subnormals. The scalar functions are NEZHA_HOST_DEVICE: the CUDA reduction kernels use them too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace nezha::collectives {

NEZHA_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

NEZHA_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// cond ? a : b on bit patterns, written with masks: GCC will not if-convert a ternary whose arms
// involve floating-point operations, and a branch stops the loops below from vectorising.
NEZHA_HOST_DEVICE inline uint32_t select_bits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// float16 -> float32 is exact. All three cases are computed and one is selected, so array loops
// over this function vectorise (no branches). Subnormal halves are renormalised by one float
// subtraction.
NEZHA_HOST_DEVICE inline float half_to_float(uint16_t h) {
  constexpr uint32_t kExpMask = 0x7C00u << 13;  // half exponent field, moved to float position
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7FFFu) << 13;  // exponent and mantissa
  const uint32_t exp = em & kExpMask;
  const uint32_t normal = em + ((127u - 15u) << 23);   // rebias the exponent
  const uint32_t inf_nan = em + ((255u - 31u) << 23);  // exponent 31 -> 255, payload kept
  // Zero/subnormal: read the mantissa as (1.m * 2^-14), then subtract the implicit 2^-14.
  const float subnormal = bits_float(em + (113u << 23)) - bits_float(113u << 23);
  const uint32_t magnitude =
      select_bits(exp == 0, float_bits(subnormal), select_bits(exp == kExpMask, inf_nan, normal));
  return bits_float(magnitude | sign);
}

// float32 -> float16, round to nearest even; overflow gives inf, NaN gives a quiet NaN. Branch-free
// for the same reason as half_to_float.
NEZHA_HOST_DEVICE inline uint16_t float_to_half(float value) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: every float >= this is inf in half
  constexpr uint32_t kMinNormal = 113u << 23;             // 2^-14
  // Adding 0.5 to a value below 2^-14 lines its bits up so that the float adder itself rounds it
  // (nearest even) to a multiple of 2^-24, the half subnormal step, in the low mantissa bits.
  const float kDenormMagic = bits_float(((127u - 15u) + (23u - 10u) + 1u) << 23);

  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits & 0x80000000u) >> 16;
  const uint32_t f = bits & 0x7FFFFFFFu;
  const uint32_t inf_nan = f > kF32Inf ? 0x7E00u : 0x7C00u;
  const uint32_t subnormal = float_bits(bits_float(f) + kDenormMagic) - float_bits(kDenormMagic);
  // Rebias, add half an ulp minus one plus the lowest kept bit (ties to even), truncate. A carry
  // out of the mantissa correctly bumps the exponent (up to infinity).
  const uint32_t normal =
      (f + (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + ((f >> 13) & 1u)) >> 13;
  const uint32_t magnitude =
      select_bits(f >= kF16Overflow, inf_nan, select_bits(f < kMinNormal, subnormal, normal));
  return static_cast<uint16_t>(magnitude | sign);
}

NEZHA_HOST_DEVICE inline float bfloat16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// float32 -> bfloat16, round to nearest even; NaN stays NaN (quiet bit forced so rounding can never
// carry a NaN into infinity).
NEZHA_HOST_DEVICE inline uint16_t float_to_bfloat16(float value) {
  const uint32_t u = float_bits(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// Portable array conversions; half_convert.h picks these or a faster CPU-specific version.
inline void half_to_float_n(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

inline void float_to_half_n(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

inline void bfloat16_to_float_n(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float(in[i]);
}

inline void float_to_bfloat16_n(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
}

}  // namespace nezha::collectives
