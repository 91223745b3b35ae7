// collectives/element_reduce.h (the per-element reduction the CUDA kernels run) for every dtype x op
// over 1-7 ranks, against (a) a reference written another way: wide integer math wrapped to the
// type, float math with independent float16/bfloat16 rounding (float_reference.h), std::min/max
// semantics spelled out; and (b) the CPU kernels' serial rank-order reduction (reduce_into rank by
// rank, then scale), which the GPU must match bit for bit. Inputs include NaN, +-inf, -0, subnormals
// and values whose sums overflow float16.
#include "collectives/element_reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/reduce.h"
#include "float_reference.h"

namespace nezha::collectives {
namespace {

using element::StorageT;
using testing::decode_small_float;
using testing::kBFloat16Format;
using testing::kHalfFormat;
using testing::SmallFloatRounder;

constexpr size_t kCount = 301;
constexpr int kRankCounts[] = {1, 2, 3, 4, 7};

template <DataType D>
constexpr bool kIsSmallFloat = D == DataType::kFloat16 || D == DataType::kBFloat16;

template <DataType D>
std::vector<StorageT<D>> random_values(std::mt19937_64& rng, size_t n) {
  using T = StorageT<D>;
  std::vector<T> v(n);
  if constexpr (D == DataType::kBool) {
    for (auto& x : v) x = static_cast<uint8_t>(rng() % 3 == 0 ? 0 : rng() % 4);  // non-canonical trues too
  } else if constexpr (kIsSmallFloat<D>) {
    const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 6e-8f, 1e-40f, 65504.0f, -60000.0f, 3e38f};
    for (auto& x : v) {
      const float f = rng() % 8 == 0 ? specials[rng() % 10]
                                     : std::ldexp(static_cast<float>(static_cast<int>(rng() % 20001) - 10000) / 4096.0f,
                                                  static_cast<int>(rng() % 9) - 4);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = D == DataType::kBFloat16 ? static_cast<uint16_t>(u >> 16) : float_to_half(f);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    const T specials[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, std::numeric_limits<T>::denorm_min(),
                          std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()};
    std::uniform_real_distribution<T> uni(-1000, 1000);
    for (auto& x : v) x = rng() % 8 == 0 ? specials[rng() % 8] : uni(rng);
  } else {
    for (auto& x : v) x = static_cast<T>(rng());  // full range: sums and products wrap
  }
  return v;
}

// The reference's view of one element: (bits or value) -> comparable result.
template <DataType D>
StorageT<D> reference_step(StorageT<D> a, StorageT<D> b, ReduceOp op) {
  using T = StorageT<D>;
  if constexpr (D == DataType::kBool) {
    const bool x = a != 0, y = b != 0;
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
    return static_cast<uint8_t>(any ? (x || y) : (x && y));
  } else if constexpr (kIsSmallFloat<D>) {
    static const SmallFloatRounder rounder(D == DataType::kFloat16 ? kHalfFormat : kBFloat16Format);
    const auto fmt = D == DataType::kFloat16 ? kHalfFormat : kBFloat16Format;
    const float x = static_cast<float>(decode_small_float(a, fmt));
    const float y = static_cast<float>(decode_small_float(b, fmt));
    float r;
    switch (op) {
      case ReduceOp::kMin: r = (std::isnan(x) || std::isnan(y)) ? x : std::min(x, y); break;
      case ReduceOp::kMax: r = (std::isnan(x) || std::isnan(y)) ? x : std::max(x, y); break;
      case ReduceOp::kProduct: r = x * y; break;
      default: r = x + y; break;
    }
    return rounder.round(r);
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kMin: return (std::isnan(a) || std::isnan(b)) ? a : std::min(a, b);
      case ReduceOp::kMax: return (std::isnan(a) || std::isnan(b)) ? a : std::max(a, b);
      case ReduceOp::kProduct: return a * b;
      default: return a + b;
    }
  } else {
    const __int128 x = a, y = b;
    __int128 v = op == ReduceOp::kMin ? std::min(x, y) : op == ReduceOp::kMax ? std::max(x, y)
                 : op == ReduceOp::kProduct ? x * y : x + y;
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<unsigned __int128>(v)));
  }
}

template <DataType D>
bool is_nan(StorageT<D> v) {
  if constexpr (D == DataType::kFloat16) return std::isnan(decode_small_float(v, kHalfFormat));
  else if constexpr (D == DataType::kBFloat16) return std::isnan(decode_small_float(v, kBFloat16Format));
  else if constexpr (std::is_floating_point_v<StorageT<D>>) return std::isnan(v);
  else return false;
}

// Equal bits, or both NaN (NaN payloads differ between float16 converters).
template <DataType D>
::testing::AssertionResult same(StorageT<D> got, StorageT<D> want) {
  if (is_nan<D>(got) && is_nan<D>(want)) return ::testing::AssertionSuccess();
  if (std::memcmp(&got, &want, sizeof got) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << +got << ", want " << +want;
}

template <DataType D, ReduceOp O>
void check_op(std::mt19937_64& rng) {
  using T = StorageT<D>;
  for (int n : kRankCounts) {
    std::vector<std::vector<T>> inputs;
    std::vector<const T*> srcs;
    for (int r = 0; r < n; ++r) inputs.push_back(random_values<D>(rng, kCount));
    for (auto& in : inputs) srcs.push_back(in.data());
    // The CPU kernels' serial rank-order reduction.
    std::vector<T> cpu = inputs[0];
    for (int r = 1; r < n; ++r) reduce_into(cpu.data(), inputs[r].data(), kCount, D, O);
    for (size_t i = 0; i < kCount; ++i) {
      T want = inputs[0][i];
      for (int r = 1; r < n; ++r) want = reference_step<D>(want, inputs[r][i], O);
      const T got = element::reduce_ranks<D, O>(srcs.data(), n, i);
      ASSERT_TRUE(same<D>(got, want)) << dtype_name(D) << " " << reduce_op_name(O) << " ranks " << n << " at " << i;
      ASSERT_TRUE(same<D>(got, cpu[i])) << dtype_name(D) << " " << reduce_op_name(O) << " vs reduce_into, ranks "
                                        << n << " at " << i;
    }
  }
}

template <DataType D>
void check_scale(std::mt19937_64& rng) {
  using T = StorageT<D>;
  for (double factor : {0.25, 1.0 / 3, -2.5, 1e6, 1e-30}) {
    std::vector<T> v = random_values<D>(rng, kCount);
    std::vector<T> cpu = v;
    scale(cpu.data(), kCount, D, factor);
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_TRUE(same<D>(element::scale_element<D>(v[i], factor), cpu[i]))
          << dtype_name(D) << " x " << factor << " at " << i;
      if constexpr (std::is_same_v<T, float>) {
        ASSERT_TRUE(same<D>(element::scale_element<D>(v[i], factor), v[i] * static_cast<float>(factor)));
      } else if constexpr (std::is_integral_v<T> && D != DataType::kFloat16 && D != DataType::kBFloat16) {
        // The product in double (Horovod's rule), rounded toward zero by floor/ceil, clamped by hand.
        const double product = static_cast<double>(v[i]) * factor;
        const double toward_zero = product < 0 ? std::ceil(product) : std::floor(product);
        T want;
        if (toward_zero <= static_cast<double>(std::numeric_limits<T>::min())) want = std::numeric_limits<T>::min();
        else if (toward_zero >= std::ldexp(1.0, std::numeric_limits<T>::digits)) want = std::numeric_limits<T>::max();
        else want = static_cast<T>(toward_zero);
        ASSERT_EQ(element::scale_element<D>(v[i], factor), want) << dtype_name(D) << " x " << factor << " at " << i;
      }
    }
  }
}

template <DataType D>
void check_dtype() {
  std::mt19937_64 rng(static_cast<uint64_t>(D) * 7919 + 1);
  check_op<D, ReduceOp::kSum>(rng);
  check_op<D, ReduceOp::kAverage>(rng);
  check_op<D, ReduceOp::kMin>(rng);
  check_op<D, ReduceOp::kMax>(rng);
  check_op<D, ReduceOp::kProduct>(rng);
  if constexpr (D != DataType::kBool) check_scale<D>(rng);
}

TEST(ElementReduce, UInt8) { check_dtype<DataType::kUInt8>(); }
TEST(ElementReduce, Int8) { check_dtype<DataType::kInt8>(); }
TEST(ElementReduce, Int16) { check_dtype<DataType::kInt16>(); }
TEST(ElementReduce, UInt16) { check_dtype<DataType::kUInt16>(); }
TEST(ElementReduce, Int32) { check_dtype<DataType::kInt32>(); }
TEST(ElementReduce, Int64) { check_dtype<DataType::kInt64>(); }
TEST(ElementReduce, Float32) { check_dtype<DataType::kFloat32>(); }
TEST(ElementReduce, Float64) { check_dtype<DataType::kFloat64>(); }
TEST(ElementReduce, Float16) { check_dtype<DataType::kFloat16>(); }
TEST(ElementReduce, BFloat16) { check_dtype<DataType::kBFloat16>(); }
TEST(ElementReduce, Bool) { check_dtype<DataType::kBool>(); }

// Spot checks a reader can verify by hand: rounding after every step, ties to even, overflow to inf.
TEST(ElementReduce, Float16RoundsAfterEachRank) {
  // 2048 + 1 + 1 in float16: each 2049 rounds to 2048 (tie, even), so the rank-order sum stays 2048.
  const uint16_t big = float_to_half(2048.0f), one = float_to_half(1.0f);
  const uint16_t in[3] = {big, one, one};
  const uint16_t* srcs[3] = {&in[0], &in[1], &in[2]};
  EXPECT_EQ((element::reduce_ranks<DataType::kFloat16, ReduceOp::kSum>(srcs, 3, 0)), big);
  const uint16_t max = 0x7BFF;  // 65504
  const uint16_t* twice[2] = {&max, &max};
  EXPECT_EQ((element::reduce_ranks<DataType::kFloat16, ReduceOp::kSum>(twice, 2, 0)), 0x7C00);  // +inf
  const uint16_t b1 = 0x3F80, tiny = 0x3B80;  // bfloat16 1.0 and 2^-8 (half an ulp of 1): tie, stays 1.0
  const uint16_t* bf[2] = {&b1, &tiny};
  EXPECT_EQ((element::reduce_ranks<DataType::kBFloat16, ReduceOp::kSum>(bf, 2, 0)), 0x3F80);
}

TEST(ElementReduce, NanMinMaxKeepTheLeftOperand) {
  const float x[2] = {1.0f, NAN};
  const float* ab[2] = {&x[0], &x[1]};
  const float* ba[2] = {&x[1], &x[0]};
  EXPECT_EQ((element::reduce_ranks<DataType::kFloat32, ReduceOp::kMin>(ab, 2, 0)), 1.0f);
  EXPECT_TRUE(std::isnan((element::reduce_ranks<DataType::kFloat32, ReduceOp::kMax>(ba, 2, 0))));
  EXPECT_TRUE(std::isnan((element::reduce_ranks<DataType::kFloat32, ReduceOp::kSum>(ab, 2, 0))));
}

}  // namespace
}  // namespace nezha::collectives
