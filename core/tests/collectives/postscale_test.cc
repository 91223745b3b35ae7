// CollectiveOptions::postscale: every element of an allreduce's result is scaled exactly once, to the
// same bits as reducing first and calling scale() on the result (what the engine did before), on
// every rank, for each algorithm and schedule.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::run_ranks;
using nezha::testing::store_value;
using nezha::testing::test_options;

enum class Algorithm { kRingPipelined, kRingLockStep, kLogStep, kHalving };

std::vector<std::vector<uint8_t>> inputs_for(int size, size_t count, DataType dtype) {
  std::mt19937 gen(static_cast<unsigned>(count * 31 + size));
  std::uniform_int_distribution<int> dist(-60, 60);
  std::vector<std::vector<uint8_t>> in(size, std::vector<uint8_t>(count * dtype_size(dtype)));
  for (auto& v : in)
    for (size_t i = 0; i < count; ++i) {
      const int x = dist(gen);
      store_value(dtype, v.data(), i, dtype == DataType::kUInt8 ? (x < 0 ? -x : x) / size : x);
    }
  return in;
}

std::vector<std::vector<uint8_t>> run(Algorithm algo, std::vector<std::vector<uint8_t>> bufs, size_t count,
                                      DataType dtype, ReduceOp op, double postscale) {
  const int size = static_cast<int>(bufs.size());
  run_ranks(
      size,
      [&](transport::PointToPointRail& rail) {
        CollectiveOptions opt = test_options(/*seq=*/3, /*segment_bytes=*/256);
        opt.postscale = postscale;
        void* b = bufs[rail.rank()].data();
        if (algo == Algorithm::kLogStep) allreduce_logstep(rail, b, count, dtype, op, opt);
        else if (algo == Algorithm::kHalving) allreduce_halving(rail, b, count, dtype, op, opt);
        else allreduce_ring(rail, b, count, dtype, op, opt);
      },
      algo == Algorithm::kRingLockStep ? 0 : SIZE_MAX);
  return bufs;
}

TEST(Postscale, EqualsReducingThenScalingOnEveryRankForEveryAlgorithm) {
  const struct {
    DataType dtype;
    ReduceOp op;
    double factor;
  } cases[] = {{DataType::kFloat32, ReduceOp::kAverage, 1.0 / 3}, {DataType::kFloat32, ReduceOp::kSum, 2.5},
               {DataType::kFloat64, ReduceOp::kAverage, 1.0 / 3}, {DataType::kFloat16, ReduceOp::kAverage, 0.25},
               {DataType::kBFloat16, ReduceOp::kMax, 1.0 / 3},    {DataType::kInt32, ReduceOp::kAverage, 1.0 / 3},
               {DataType::kUInt8, ReduceOp::kSum, 0.5},         {DataType::kInt16, ReduceOp::kAverage, 1.0 / 3}};
  const size_t counts[] = {1, 3, 1000, 4099};  // fewer elements than ranks; many segments
  for (Algorithm algo : {Algorithm::kRingPipelined, Algorithm::kRingLockStep, Algorithm::kLogStep, Algorithm::kHalving})
    for (int size : {1, 2, 3, 4, 6})
      for (size_t count : counts)
        for (const auto& c : cases) {
          SCOPED_TRACE("algorithm " + std::to_string(static_cast<int>(algo)) + ", " + std::to_string(size) +
                       " ranks, " + std::to_string(count) + " x " + dtype_name(c.dtype) + " " +
                       reduce_op_name(c.op) + " * " + std::to_string(c.factor));
          const auto inputs = inputs_for(size, count, c.dtype);
          auto expected = run(algo, inputs, count, c.dtype, c.op, 1.0)[0];
          scale(expected.data(), count, c.dtype, c.factor);
          const auto got = run(algo, inputs, count, c.dtype, c.op, c.factor);
          for (int r = 0; r < size; ++r)
            ASSERT_EQ(std::memcmp(got[r].data(), expected.data(), expected.size()), 0) << "rank " << r;
        }
}

TEST(Postscale, OverwriteHookStillSeesEveryChangedByteFirst) {
  // The scaled block is part of what the hook must announce before it changes (a redo rebuilds the
  // input from those ranges).
  const int size = 3;
  const size_t count = 1000;
  const auto inputs = inputs_for(size, count, DataType::kFloat32);
  std::vector<std::vector<uint8_t>> bufs = inputs;
  std::vector<std::vector<uint8_t>> saved(size, std::vector<uint8_t>(count * 4));
  std::vector<std::vector<bool>> covered(size, std::vector<bool>(count * 4, false));
  run_ranks(size, [&](transport::PointToPointRail& rail) {
    const int r = rail.rank();
    CollectiveOptions opt = test_options(/*seq=*/4, /*segment_bytes=*/256);
    opt.postscale = 1.0 / size;
    opt.before_overwrite = [&, r](size_t offset, size_t bytes) {
      for (size_t i = offset; i < offset + bytes; ++i)
        if (!covered[r][i]) {
          covered[r][i] = true;
          saved[r][i] = bufs[r][i];
        }
    };
    allreduce_ring(rail, bufs[r].data(), count, DataType::kFloat32, ReduceOp::kAverage, opt);
  });
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < count * 4; ++i) {
      const uint8_t before = covered[r][i] ? saved[r][i] : bufs[r][i];
      ASSERT_EQ(before, inputs[r][i]) << "rank " << r << " byte " << i;
    }
}

}  // namespace
}  // namespace nezha::collectives
