// reducescatterv on 1..5 in-memory ranks with equal, growing and zero-sized blocks.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "common/error.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::load_value;
using nezha::testing::make_input;
using nezha::testing::reference_reduction;
using nezha::testing::run_ranks;
using nezha::testing::test_options;

// (ranks, base count, segment bytes)
using Params = std::tuple<int, size_t, size_t>;
class ReducescatterTest : public ::testing::TestWithParam<Params> {};

TEST_P(ReducescatterTest, RankRGetsTheReductionOfBlockR) {
  const auto [n, base, segment_bytes] = GetParam();
  std::vector<size_t> same(n, base), uneven(n);
  for (int r = 0; r < n; ++r) uneven[r] = r % 2 == 1 ? 0 : base + static_cast<size_t>(r);
  const std::pair<DataType, ReduceOp> cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                                                 {DataType::kInt32, ReduceOp::kMax},
                                                 {DataType::kFloat16, ReduceOp::kSum},
                                                 {DataType::kInt64, ReduceOp::kProduct},
                                                 {DataType::kInt16, ReduceOp::kSum}};
  for (const auto& counts : {same, uneven}) {
    for (const auto& [dtype, op] : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + reduce_op_name(op));
      size_t total = 0;
      std::vector<size_t> offset(n);
      for (int r = 0; r < n; ++r) offset[r] = total, total += counts[r];
      const size_t esize = dtype_size(dtype);
      std::vector<std::vector<uint8_t>> ins(n), outs(n);
      for (int r = 0; r < n; ++r) {
        ins[r] = make_input(dtype, r, total);
        outs[r].assign(counts[r] * esize, 0xEE);
      }
      run_ranks(n, [&](transport::PointToPointRail& rail) {
        const int r = rail.rank();
        reducescatterv(rail, ins[r].data(), outs[r].data(), counts, dtype, op,
                       test_options(21, segment_bytes));
      });
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < counts[r]; ++i) {
          ASSERT_EQ(load_value(dtype, outs[r].data(), i),
                    reference_reduction(op, dtype, n, offset[r] + i))
              << "rank " << r << " element " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksCountsSegments, ReducescatterTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values(0, 1, 7, 1000),
                       ::testing::Values(size_t(1) << 20, size_t(64))),
    [](const ::testing::TestParamInfo<Params>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_count" +
             std::to_string(std::get<1>(info.param)) + "_seg" +
             std::to_string(std::get<2>(info.param));
    });

TEST(Reducescatter, RejectsWrongNumberOfBlocks) {
  nezha::testing::run_ranks(2, [&](transport::PointToPointRail& rail) {
    float buf[4] = {};
    EXPECT_THROW(reducescatterv(rail, buf, buf, {4}, DataType::kFloat32, ReduceOp::kSum,
                                test_options()),
                 InvalidArgument);
  });
}

}  // namespace
}  // namespace nezha::collectives
