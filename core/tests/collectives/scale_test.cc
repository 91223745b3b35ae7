#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/reduce.h"
#include "common/error.h"
#include "float_reference.h"

namespace nezha::collectives {
namespace {

// Horovod multiplies a float32 tensor by float(factor) in float32; rounding the product of the
// doubles once instead differs in the last bit for some inputs (checked below, so the test would
// notice a return to double arithmetic).
TEST(Scale, Float32IsScaledInFloat32LikeHorovod) {
  std::vector<float> v;
  for (int i = 1; i <= 2000; ++i) v.push_back(static_cast<float>(i) * 0.37f - 300.0f);
  const std::vector<float> in = v;
  const double factor = 0.1915194503788923;  // numpy.random.seed(1234); numpy.random.uniform()
  scale(v.data(), v.size(), DataType::kFloat32, factor);
  int differs_from_double = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], in[i] * static_cast<float>(factor)) << i;
    differs_from_double += v[i] != static_cast<float>(static_cast<double>(in[i]) * factor);
  }
  EXPECT_GT(differs_from_double, 0);
}

TEST(Scale, Float64) {
  std::vector<double> v = {1.0, -2.5, 1e300};
  scale(v.data(), v.size(), DataType::kFloat64, 0.25);
  EXPECT_EQ(v, (std::vector<double>{0.25, -0.625, 2.5e299}));
}

TEST(Scale, IntegersRoundTowardZeroAndSaturate) {
  std::vector<int32_t> i32 = {7, -7, 1, -1, 2000000000, std::numeric_limits<int32_t>::min()};
  scale(i32.data(), i32.size(), DataType::kInt32, 0.5);
  EXPECT_EQ(i32, (std::vector<int32_t>{3, -3, 0, 0, 1000000000, -1073741824}));

  std::vector<int16_t> i16 = {7, -7, 30000, -30000};
  scale(i16.data(), i16.size(), DataType::kInt16, 1.5);
  EXPECT_EQ(i16, (std::vector<int16_t>{10, -10, 32767, -32768}));

  std::vector<int8_t> i8 = {100, -100, 5};
  scale(i8.data(), i8.size(), DataType::kInt8, 2.0);
  EXPECT_EQ(i8, (std::vector<int8_t>{127, -128, 10}));

  std::vector<uint8_t> u8 = {200, 10};
  scale(u8.data(), u8.size(), DataType::kUInt8, -1.0);
  EXPECT_EQ(u8, (std::vector<uint8_t>{0, 0}));

  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::max() / 2, -9};
  scale(i64.data(), i64.size(), DataType::kInt64, 4.0);
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64[1], -36);
}

TEST(Scale, HalfTypesScaleInFloat32) {
  const testing::SmallFloatRounder half_rounder(testing::kHalfFormat);
  const testing::SmallFloatRounder bf16_rounder(testing::kBFloat16Format);
  std::vector<uint16_t> h, b;
  for (uint32_t bits = 0; bits < 0x7C00; bits += 37) h.push_back(static_cast<uint16_t>(bits));
  for (uint32_t bits = 0; bits < 0x7F80; bits += 37) b.push_back(static_cast<uint16_t>(bits));
  const std::vector<uint16_t> h_in = h, b_in = b;
  const double factor = 0.3;
  scale(h.data(), h.size(), DataType::kFloat16, factor);
  scale(b.data(), b.size(), DataType::kBFloat16, factor);
  for (size_t i = 0; i < h.size(); ++i) {
    const float x = static_cast<float>(testing::decode_small_float(h_in[i], testing::kHalfFormat));
    ASSERT_EQ(h[i], half_rounder.round(x * static_cast<float>(factor))) << i;
  }
  for (size_t i = 0; i < b.size(); ++i) {
    const float x = static_cast<float>(testing::decode_small_float(b_in[i], testing::kBFloat16Format));
    ASSERT_EQ(b[i], bf16_rounder.round(x * static_cast<float>(factor))) << i;
  }
}

TEST(Scale, FactorOneIsANoOpEvenForNanPayloads) {
  uint32_t bits[2] = {0x7FA00001u, 0xFFC12345u};
  scale(bits, 2, DataType::kFloat32, 1.0);
  EXPECT_EQ(bits[0], 0x7FA00001u);
  EXPECT_EQ(bits[1], 0xFFC12345u);
  uint8_t flags[2] = {1, 0};
  scale(flags, 2, DataType::kBool, 1.0);  // allowed: nothing to do
  EXPECT_EQ(flags[0], 1);
}

TEST(Scale, RejectsBoolAndNonFiniteIntegerFactors) {
  uint8_t flags[2] = {1, 0};
  EXPECT_THROW(scale(flags, 2, DataType::kBool, 0.5), InvalidArgument);
  int32_t x = 3;
  EXPECT_THROW(scale(&x, 1, DataType::kInt32, std::nan("")), InvalidArgument);
  EXPECT_EQ(x, 3);
  EXPECT_THROW(scale(&x, 1, static_cast<DataType>(99), 2.0), InvalidArgument);
}

}  // namespace
}  // namespace nezha::collectives
