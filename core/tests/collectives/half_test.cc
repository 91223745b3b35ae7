#include "collectives/half.h"
#include "collectives/half_convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "float_reference.h"

namespace nezha::collectives {
namespace {

using testing::decode_small_float;
using testing::kBFloat16Format;
using testing::kHalfFormat;
using testing::SmallFloatFormat;
using testing::SmallFloatRounder;

bool same_value(float got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
}

// Floats that stress rounding: random bit patterns over the whole range, values on and next to the
// halfway points of the small format, and the special values.
std::vector<float> rounding_probes(SmallFloatFormat fmt) {
  std::vector<float> probes = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(), 5.96e-8f, 2.98e-8f, 2.99e-8f,
                               6.1e-5f, 3.0e38f, 3.4e38f};
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) probes.push_back(bits_float(any_bits(rng)));
  // Midpoints between consecutive representable values, and one float ulp either side.
  const int finite_patterns = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits;
  for (int b = 0; b + 1 < finite_patterns; b += 7) {
    const float mid = static_cast<float>(
        (decode_small_float(static_cast<uint16_t>(b), fmt) +
         decode_small_float(static_cast<uint16_t>(b + 1), fmt)) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  return probes;
}

TEST(Half, EveryHalfDecodesExactly) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<uint16_t>(b);
    ASSERT_TRUE(same_value(half_to_float(h), decode_small_float(h, kHalfFormat))) << std::hex << b;
    // Every non-NaN half survives the round trip bit for bit.
    if (!std::isnan(half_to_float(h))) {
      ASSERT_EQ(float_to_half(half_to_float(h)), h) << std::hex << b;
    }
  }
}

TEST(Half, RoundsToNearestEven) {
  const SmallFloatRounder rounder(kHalfFormat);
  for (float f : rounding_probes(kHalfFormat)) {
    const uint16_t got = float_to_half(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(got))) << f;
      continue;
    }
    ASSERT_EQ(got, rounder.round(f)) << "value " << f << " bits " << std::hex << float_bits(f);
  }
}

#if defined(__FLT16_MAX__)
// Where the compiler has _Float16, its conversions are a second independent reference.
TEST(Half, AgreesWithCompilerFloat16) {
  for (float f : rounding_probes(kHalfFormat)) {
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    ASSERT_EQ(float_to_half(f), bits) << f;
  }
}
#endif

// Every float16 array converter set (portable, and F16C where this CPU has it) against the scalar
// functions, which the tests above check against the independent reference.
std::vector<const HalfArrayConverters*> float16_converter_sets() {
  std::vector<const HalfArrayConverters*> sets = {&float16_portable_converters()};
  if (const HalfArrayConverters* f16c = float16_f16c_converters()) sets.push_back(f16c);
  return sets;
}

TEST(Half, ArrayConvertersMatchScalar) {
  std::vector<uint16_t> halves(0x10000 + 5);  // +5: a length that is not a multiple of 8
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 40503u);
  const std::vector<float> probes = rounding_probes(kHalfFormat);
  for (const HalfArrayConverters* cvt : float16_converter_sets()) {
    SCOPED_TRACE(cvt->name);
    std::vector<float> floats(halves.size());
    cvt->widen(halves.data(), floats.data(), halves.size());
    for (size_t i = 0; i < halves.size(); ++i) {
      ASSERT_TRUE(same_value(floats[i], decode_small_float(halves[i], kHalfFormat))) << i;
    }
    std::vector<uint16_t> narrowed(probes.size());
    cvt->narrow(probes.data(), narrowed.data(), probes.size());
    for (size_t i = 0; i < probes.size(); ++i) {
      if (std::isnan(probes[i])) {
        ASSERT_TRUE(std::isnan(half_to_float(narrowed[i])));
      } else {
        ASSERT_EQ(narrowed[i], float_to_half(probes[i])) << probes[i];
      }
    }
  }
}

TEST(Half, FastestConvertersAreUsed) {
  const HalfArrayConverters* f16c = float16_f16c_converters();
  EXPECT_STREQ(float16_converters().name, f16c ? "f16c" : "portable");
}

TEST(BFloat16, EveryValueDecodesExactlyAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<uint16_t>(b);
    ASSERT_TRUE(same_value(bfloat16_to_float(h), decode_small_float(h, kBFloat16Format)));
    if (!std::isnan(bfloat16_to_float(h))) {
      ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(h)), h) << std::hex << b;
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  const SmallFloatRounder rounder(kBFloat16Format);
  for (float f : rounding_probes(kBFloat16Format)) {
    const uint16_t got = float_to_bfloat16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bfloat16_to_float(got))) << f;
      continue;
    }
    ASSERT_EQ(got, rounder.round(f)) << "value " << f << " bits " << std::hex << float_bits(f);
  }
}

TEST(BFloat16, ArrayConvertersMatchScalar) {
  std::vector<const HalfArrayConverters*> sets = {&bfloat16_portable_converters()};
  if (const HalfArrayConverters* avx2 = bfloat16_avx2_converters()) sets.push_back(avx2);
  std::vector<uint16_t> values(0x10000 + 5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(i * 40503u);
  const std::vector<float> probes = rounding_probes(kBFloat16Format);
  for (const HalfArrayConverters* cvt : sets) {
    SCOPED_TRACE(cvt->name);
    std::vector<float> floats(values.size());
    cvt->widen(values.data(), floats.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_value(floats[i], decode_small_float(values[i], kBFloat16Format))) << i;
    }
    std::vector<uint16_t> narrowed(probes.size());
    cvt->narrow(probes.data(), narrowed.data(), probes.size());
    for (size_t i = 0; i < probes.size(); ++i) {
      if (std::isnan(probes[i])) {
        ASSERT_TRUE(std::isnan(bfloat16_to_float(narrowed[i])));
      } else {
        ASSERT_EQ(narrowed[i], float_to_bfloat16(probes[i])) << probes[i];
      }
    }
  }
  EXPECT_STREQ(bfloat16_converters().name, bfloat16_avx2_converters() ? "avx2" : "portable");
}

TEST(BFloat16, NanNeverBecomesInfinity) {
  // A signalling NaN whose payload would carry into the exponent under naive rounding.
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(bits_float(0x7F80FFFFu)))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(bits_float(0xFFFFFFFFu)))));
}

}  // namespace
}  // namespace nezha::collectives
