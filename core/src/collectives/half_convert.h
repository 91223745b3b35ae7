// float16/bfloat16 array converters for the chunked kernels, chosen once per process for this CPU.
//
// Why at run time: the library is built for baseline x86-64 (no -march), where the portable float16
// conversion costs ~20 instructions per element and makes float16 reduction slower than a 2 Gbit/s
// pair of rails. Nearly every x86 CPU since 2012 has F16C, which does it in one instruction per 8
// elements; a function compiled for that target is called only when the CPU reports the feature.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nezha::collectives {

using WidenFn = void (*)(const uint16_t* in, float* out, size_t n);
using NarrowFn = void (*)(const float* in, uint16_t* out, size_t n);

struct HalfArrayConverters {
  WidenFn widen;
  NarrowFn narrow;
  const char* name;  // "portable", "f16c", "avx2" (for tests and logs)
};

// Fastest float16 converters this CPU supports.
const HalfArrayConverters& float16_converters();
// Always available; the reference the faster versions are tested against.
const HalfArrayConverters& float16_portable_converters();
// F16C converters, or nullptr when the CPU (or the build target) lacks F16C.
const HalfArrayConverters* float16_f16c_converters();

// bfloat16 conversion is shifts and one add, which SSE2 already vectorises; the AVX2 build of the
// same loops doubles the lanes.
const HalfArrayConverters& bfloat16_converters();
const HalfArrayConverters& bfloat16_portable_converters();
const HalfArrayConverters* bfloat16_avx2_converters();  // nullptr without AVX2

}  // namespace nezha::collectives
