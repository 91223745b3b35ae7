#include "collectives/half_convert.h"

#include "collectives/half.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
// x86 with GCC/Clang: functions can be compiled for a wider target than the build and picked at run
// time (target attribute + __builtin_cpu_supports).
#define NEZHA_X86_CLONES 1
#endif

namespace nezha::collectives {
namespace {

#ifdef NEZHA_X86_CLONES
// Compiled for F16C regardless of the build's -march; only called after the CPU check below.
__attribute__((target("avx,f16c"))) void half_to_float_n_f16c(const uint16_t* in, float* out,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

__attribute__((target("avx,f16c"))) void float_to_half_n_f16c(const float* in, uint16_t* out,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}

// The portable bfloat16 loops, compiled for AVX2 (8 lanes instead of SSE2's 4).
__attribute__((target("avx2"))) void bfloat16_to_float_n_avx2(const uint16_t* in, float* out,
                                                              size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float(in[i]);
}

__attribute__((target("avx2"))) void float_to_bfloat16_n_avx2(const float* in, uint16_t* out,
                                                              size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

bool cpu_has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#endif

const HalfArrayConverters kPortable{half_to_float_n, float_to_half_n, "portable"};

}  // namespace

const HalfArrayConverters& float16_portable_converters() { return kPortable; }

const HalfArrayConverters* float16_f16c_converters() {
#ifdef NEZHA_X86_CLONES
  static const HalfArrayConverters f16c{half_to_float_n_f16c, float_to_half_n_f16c, "f16c"};
  static const bool available = cpu_has_f16c();
  return available ? &f16c : nullptr;
#else
  return nullptr;
#endif
}

const HalfArrayConverters& float16_converters() {
  static const HalfArrayConverters& best =
      float16_f16c_converters() ? *float16_f16c_converters() : kPortable;
  return best;
}

const HalfArrayConverters& bfloat16_portable_converters() {
  static const HalfArrayConverters portable{bfloat16_to_float_n, float_to_bfloat16_n, "portable"};
  return portable;
}

const HalfArrayConverters* bfloat16_avx2_converters() {
#ifdef NEZHA_X86_CLONES
  static const HalfArrayConverters avx2{bfloat16_to_float_n_avx2, float_to_bfloat16_n_avx2, "avx2"};
  static const bool available = cpu_has_avx2();
  return available ? &avx2 : nullptr;
#else
  return nullptr;
#endif
}

const HalfArrayConverters& bfloat16_converters() {
  static const HalfArrayConverters& best =
      bfloat16_avx2_converters() ? *bfloat16_avx2_converters() : bfloat16_portable_converters();
  return best;
}

}  // namespace nezha::collectives
