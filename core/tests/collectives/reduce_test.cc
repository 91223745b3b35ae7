// reduce_into for every dtype x op against plain reference loops written independently of the
// kernels (float16/bfloat16: exact decode, float32 math, reference rounding from float_reference.h).
#include "collectives/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "float_reference.h"

namespace nezha::collectives {
namespace {

using testing::decode_small_float;
using testing::kBFloat16Format;
using testing::kHalfFormat;
using testing::SmallFloatRounder;

constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kProduct};
// Odd, and longer than the kernels' 512-element chunks so chunk edges are exercised.
constexpr size_t kCount = 1237;

template <typename T>
T reference_op(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProduct: return a * b;
  }
  return a;
}

// Integer reference: exact math in a wide type, then wrapped to T (two's complement).
template <typename T>
T reference_int_op(T a, T b, ReduceOp op) {
  const __int128 x = a, y = b;
  __int128 v;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: v = x + y; break;
    case ReduceOp::kMin: v = x < y ? x : y; break;
    case ReduceOp::kMax: v = x > y ? x : y; break;
    default: v = x * y; break;
  }
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<unsigned __int128>(v)));
}

std::mt19937_64& rng() {
  static std::mt19937_64 engine(1234);
  return engine;
}

template <typename T>
std::vector<T> random_ints() {
  std::uniform_int_distribution<int64_t> dist(std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  std::vector<T> v(kCount);
  for (auto& x : v) x = static_cast<T>(dist(rng()));
  return v;
}

template <typename T>
void check_integer_type(DataType dtype) {
  for (ReduceOp op : kAllOps) {
    std::vector<T> dst = random_ints<T>();
    const std::vector<T> src = random_ints<T>();
    std::vector<T> want(kCount);
    for (size_t i = 0; i < kCount; ++i) want[i] = reference_int_op(dst[i], src[i], op);
    reduce_into(dst.data(), src.data(), kCount, dtype, op);
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(dst[i], want[i]) << dtype_name(dtype) << " " << reduce_op_name(op) << " at " << i;
    }
  }
}

TEST(ReduceInto, IntegerTypesWrapLikeTwosComplement) {
  check_integer_type<uint8_t>(DataType::kUInt8);
  check_integer_type<int8_t>(DataType::kInt8);
  check_integer_type<int16_t>(DataType::kInt16);
  check_integer_type<uint16_t>(DataType::kUInt16);
  check_integer_type<int32_t>(DataType::kInt32);
  check_integer_type<int64_t>(DataType::kInt64);
}

// Random floats of mixed magnitude plus specials (inf, nan, signed zeros, subnormals).
template <typename T>
std::vector<T> random_floats() {
  std::uniform_real_distribution<double> mantissa(-2, 2);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<T> v(kCount);
  for (auto& x : v) x = static_cast<T>(std::ldexp(mantissa(rng()), exponent(rng())));
  const T specials[] = {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN(), T(0), -T(0),
                        std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max()};
  std::uniform_int_distribution<size_t> pos(0, kCount - 1);
  for (int i = 0; i < 20; ++i) v[pos(rng())] = specials[i % 7];
  return v;
}

template <typename T>
bool same_float(T got, T want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::memcmp(&got, &want, sizeof(T)) == 0;
}

template <typename T>
void check_float_type(DataType dtype) {
  for (ReduceOp op : kAllOps) {
    std::vector<T> dst = random_floats<T>();
    const std::vector<T> src = random_floats<T>();
    std::vector<T> want(kCount);
    for (size_t i = 0; i < kCount; ++i) want[i] = reference_op(dst[i], src[i], op);
    reduce_into(dst.data(), src.data(), kCount, dtype, op);
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_TRUE(same_float(dst[i], want[i]))
          << dtype_name(dtype) << " " << reduce_op_name(op) << " at " << i << ": got " << dst[i]
          << " want " << want[i];
    }
  }
}

TEST(ReduceInto, Float32AndFloat64MatchPlainLoops) {
  check_float_type<float>(DataType::kFloat32);
  check_float_type<double>(DataType::kFloat64);
}

void check_small_float_type(DataType dtype, testing::SmallFloatFormat fmt) {
  const SmallFloatRounder rounder(fmt);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFF);
  for (ReduceOp op : kAllOps) {
    std::vector<uint16_t> dst(kCount), src(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      dst[i] = static_cast<uint16_t>(bits(rng()));
      src[i] = static_cast<uint16_t>(bits(rng()));
    }
    std::vector<double> want(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      const float a = static_cast<float>(decode_small_float(dst[i], fmt));
      const float b = static_cast<float>(decode_small_float(src[i], fmt));
      want[i] = decode_small_float(rounder.round(reference_op(a, b, op)), fmt);
    }
    reduce_into(dst.data(), src.data(), kCount, dtype, op);
    for (size_t i = 0; i < kCount; ++i) {
      const double got = decode_small_float(dst[i], fmt);
      const bool ok = std::isnan(want[i]) ? std::isnan(got)
                                          : got == want[i] && std::signbit(got) == std::signbit(want[i]);
      ASSERT_TRUE(ok) << dtype_name(dtype) << " " << reduce_op_name(op) << " at " << i << ": got "
                      << got << " want " << want[i];
    }
  }
}

TEST(ReduceInto, Float16ComputesInFloat32AndRoundsOnce) {
  check_small_float_type(DataType::kFloat16, kHalfFormat);
}

TEST(ReduceInto, BFloat16ComputesInFloat32AndRoundsOnce) {
  check_small_float_type(DataType::kBFloat16, kBFloat16Format);
}

TEST(ReduceInto, Float16SumRoundsHalfwayToEven) {
  // 2048 + 1 is halfway between the halves 2048 and 2050: ties go to the even mantissa (2048).
  uint16_t dst = 0x6800;  // 2048
  const uint16_t one = 0x3C00;
  reduce_into(&dst, &one, 1, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(dst, 0x6800);
  uint16_t odd = 0x6801;  // 2050; 2050 + 1 ties to 2052 (even mantissa)
  reduce_into(&odd, &one, 1, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(odd, 0x6802);
}

TEST(ReduceInto, BoolUsesLogicalOrAndAnd) {
  // Any non-zero byte is true; results are 0 or 1.
  const std::vector<uint8_t> a = {0, 0, 1, 1, 2, 0, 255, 7};
  const std::vector<uint8_t> b = {0, 1, 0, 1, 0, 9, 128, 1};
  for (ReduceOp op : kAllOps) {
    std::vector<uint8_t> dst = a;
    reduce_into(dst.data(), b.data(), a.size(), DataType::kBool, op);
    const bool is_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    for (size_t i = 0; i < a.size(); ++i) {
      const bool want = is_and ? (a[i] != 0 && b[i] != 0) : (a[i] != 0 || b[i] != 0);
      EXPECT_EQ(dst[i], want ? 1 : 0) << reduce_op_name(op) << " at " << i;
    }
  }
}

TEST(ReduceInto, ZeroCountTouchesNothing) {
  reduce_into(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum);
}

TEST(ReduceInto, RejectsUnknownCodes) {
  float x = 1, y = 2;
  EXPECT_THROW(reduce_into(&x, &y, 1, static_cast<DataType>(42), ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(reduce_into(&x, &y, 1, DataType::kFloat32, static_cast<ReduceOp>(42)),
               InvalidArgument);
}

}  // namespace
}  // namespace nezha::collectives
