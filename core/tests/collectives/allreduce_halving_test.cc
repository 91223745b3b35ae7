// Halving/doubling allreduce (Rabenseifner) on 2..9 and 16 in-memory ranks: every dtype x op
// against a serial reference, counts smaller than the rank count, uneven and multi-segment ones,
// in place and out of place in one job; bit-identical float results on every rank; allreduce()'s
// choice of it between the log-step and ring bounds.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::input_value;
using nezha::testing::load_value;
using nezha::testing::reference_op;
using nezha::testing::run_ranks;
using nezha::testing::store_value;
using nezha::testing::test_options;

const int kRankCounts[] = {2, 3, 4, 5, 6, 7, 8, 9, 16};

const DataType kDtypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kUInt16,   DataType::kInt16,
                            DataType::kInt32,   DataType::kInt64,   DataType::kFloat16,  DataType::kBFloat16,
                            DataType::kFloat32, DataType::kFloat64, DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// Inputs whose reduction over up to 16 ranks is exact in every dtype, in any order: typed_values'
// small integers, except for Product, whose factors are +-1 and a few 2s (16 factors of 3 would
// overflow int8 and float16).
double value(DataType dtype, ReduceOp op, int rank, size_t i) {
  if (op != ReduceOp::kProduct || dtype == DataType::kBool) return input_value(dtype, rank, i);
  static const double kFactors[] = {1, -1, 2, 1, -1, 1, 1};
  const double v = kFactors[(static_cast<size_t>(rank) * 5 + i * 3 + i / 7) % 7];
  return (dtype == DataType::kUInt8 || dtype == DataType::kUInt16) ? std::fabs(v) : v;
}

std::vector<uint8_t> input(DataType dtype, ReduceOp op, int rank, size_t count) {
  std::vector<uint8_t> buf(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) store_value(dtype, buf.data(), i, value(dtype, op, rank, i));
  return buf;
}

double reference(DataType dtype, ReduceOp op, int size, size_t i) {
  double acc = value(dtype, op, 0, i);
  for (int r = 1; r < size; ++r) acc = reference_op(op, dtype, acc, value(dtype, op, r, i));
  return acc;
}

TEST(AllreduceHalving, EveryDtypeAndOpMatchesTheSerialReferenceOnEveryRank) {
  // (count, segment bytes): one element; fewer elements than most rank counts; uneven blocks in
  // one segment; uneven blocks over many segments.
  const std::pair<size_t, size_t> shapes[] = {{1, 1 << 20}, {5, 1 << 20}, {1003, 1 << 20}, {4099, 256}};
  for (int size : kRankCounts)
    for (const auto& [count, segment_bytes] : shapes)
      for (DataType dtype : kDtypes)
        for (ReduceOp op : kOps) {
          SCOPED_TRACE(std::to_string(size) + " ranks, " + std::to_string(count) + " x " + dtype_name(dtype) +
                       " " + reduce_op_name(op) + ", segment " + std::to_string(segment_bytes));
          std::vector<std::vector<uint8_t>> in(static_cast<size_t>(size)), out(static_cast<size_t>(size));
          for (int r = 0; r < size; ++r) {
            in[r] = input(dtype, op, r, count);
            out[r] = in[r];
          }
          run_ranks(size, [&](transport::PointToPointRail& rail) {
            CollectiveOptions opt = test_options(/*seq=*/7, segment_bytes);
            auto& o = out[rail.rank()];
            if (rail.rank() % 2 == 0) {
              allreduce_halving(rail, o.data(), count, dtype, op, opt);  // in place
            } else {
              allreduce_halving(rail, in[rail.rank()].data(), o.data(), count, dtype, op, opt);
            }
          });
          for (int r = 0; r < size; ++r) {
            ASSERT_EQ(in[r], input(dtype, op, r, count)) << "rank " << r << ": the input was written";
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(load_value(dtype, out[r].data(), i), reference(dtype, op, size, i))
                  << "rank " << r << " element " << i;
          }
        }
}

// Random floats: the sum's rounding depends on the order of additions, and every rank must still
// hold the same bits, within float tolerance of the exact sum; postscale included.
TEST(AllreduceHalving, RandomFloatSumsAreBitIdenticalOnEveryRank) {
  for (int size : kRankCounts)
    for (double postscale : {1.0, 1.0 / 3}) {
      const size_t count = 10007;
      std::mt19937 rng(static_cast<unsigned>(size));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<std::vector<float>> bufs(static_cast<size_t>(size), std::vector<float>(count));
      std::vector<double> exact(count, 0.0);
      for (auto& b : bufs)
        for (size_t i = 0; i < count; ++i) {
          b[i] = dist(rng) * (i % 3 == 0 ? 1e6f : 1e-3f);
          exact[i] += b[i];
        }
      run_ranks(size, [&](transport::PointToPointRail& rail) {
        CollectiveOptions opt = test_options(/*seq=*/9, /*segment_bytes=*/1000);
        opt.postscale = postscale;
        allreduce_halving(rail, bufs[rail.rank()].data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
      });
      for (int r = 1; r < size; ++r)
        ASSERT_EQ(std::memcmp(bufs[0].data(), bufs[r].data(), count * sizeof(float)), 0)
            << "rank " << r << " of " << size << " differs from rank 0";
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(bufs[0][i], exact[i] * postscale, 1e-6 * size * (i % 3 == 0 ? 1e6 : 1e-3) + 1e-9)
            << size << " ranks, element " << i;
    }
}

// Min/Max with NaN depend on the operand order; the canonical order keeps every rank identical.
TEST(AllreduceHalving, NanMinMaxAgreeOnEveryRank) {
  for (int size : {3, 6, 16})
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      const size_t count = 300;
      std::vector<std::vector<float>> bufs(static_cast<size_t>(size), std::vector<float>(count));
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < count; ++i)
          bufs[r][i] = ((i + r) % 4 == 0) ? std::nanf("") : static_cast<float>(r * 10 + i % 5);
      run_ranks(size, [&](transport::PointToPointRail& rail) {
        allreduce_halving(rail, bufs[rail.rank()].data(), count, DataType::kFloat32, op, test_options(1, 64));
      });
      for (int r = 1; r < size; ++r)
        ASSERT_EQ(std::memcmp(bufs[0].data(), bufs[r].data(), count * sizeof(float)), 0)
            << size << " ranks, " << reduce_op_name(op) << ": rank " << r << " differs";
    }
}

// allreduce() runs halving between logstep_max_bytes and halving_max_bytes: the same bits as
// calling it directly (random floats tell the algorithms apart), and the ring above.
TEST(AllreduceHalving, AllreduceChoosesItBetweenTheLogstepAndRingBounds) {
  const int size = 6;
  const size_t count = 5000;  // 20000 bytes
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> inputs(size, std::vector<float>(count));
  for (auto& b : inputs)
    for (auto& v : b) v = dist(rng) * 1e4f;
  auto run = [&](size_t logstep_max, size_t halving_max, bool direct) {
    auto bufs = inputs;
    run_ranks(size, [&](transport::PointToPointRail& rail) {
      CollectiveOptions opt = test_options(/*seq=*/2, /*segment_bytes=*/4096);
      opt.logstep_max_bytes = logstep_max;
      opt.halving_max_bytes = halving_max;
      float* b = bufs[rail.rank()].data();
      if (direct) allreduce_halving(rail, b, count, DataType::kFloat32, ReduceOp::kSum, opt);
      else allreduce(rail, b, count, DataType::kFloat32, ReduceOp::kSum, opt);
    });
    return bufs[0];
  };
  const auto halving = run(0, 0, /*direct=*/true);
  EXPECT_EQ(run(1000, 20000, false), halving);  // at the bound: halving
  EXPECT_NE(run(1000, 19999, false), halving);  // above it: the ring, which adds in another order
  EXPECT_NE(run(20000, 1 << 30, false), halving);  // log-step first
}

}  // namespace
}  // namespace nezha::collectives
