// Allreduce algorithms on 1..5 in-memory ranks against a serial reference, for empty, single,
// odd-sized, large and multi-segment payloads, and bit-identical results across ranks.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::make_input;
using nezha::testing::reference_reduction;
using nezha::testing::run_ranks;
using nezha::testing::test_options;

using AllreduceFn = void (*)(transport::PointToPointRail&, void*, size_t, DataType, ReduceOp,
                             const CollectiveOptions&);

struct Algorithm {
  const char* name;
  AllreduceFn fn;
  size_t logstep_max_bytes;  // only read by allreduce()
  size_t halving_max_bytes;  // only read by allreduce()
};

const Algorithm kAlgorithms[] = {
    {"ring", allreduce_ring, 0, 0},
    {"logstep", allreduce_logstep, 0, 0},
    {"halving", allreduce_halving, 0, SIZE_MAX},  // allreduce() with these options runs it too
    {"auto_small_is_logstep", allreduce, size_t(1) << 30, 0},
    {"auto_mid_is_halving", allreduce, 0, SIZE_MAX},
    {"auto_large_is_ring", allreduce, 0, 0},
};

struct Case {
  DataType dtype;
  ReduceOp op;
};

const Case kCases[] = {
    {DataType::kFloat32, ReduceOp::kSum},     {DataType::kFloat32, ReduceOp::kMin},
    {DataType::kFloat32, ReduceOp::kMax},     {DataType::kFloat32, ReduceOp::kProduct},
    {DataType::kInt32, ReduceOp::kSum},       {DataType::kInt32, ReduceOp::kProduct},
    {DataType::kInt64, ReduceOp::kMax},       {DataType::kInt8, ReduceOp::kMin},
    {DataType::kUInt8, ReduceOp::kSum},       {DataType::kFloat16, ReduceOp::kSum},
    {DataType::kInt16, ReduceOp::kSum},       {DataType::kInt16, ReduceOp::kMin},
    {DataType::kUInt16, ReduceOp::kSum},      {DataType::kUInt16, ReduceOp::kMax},
    {DataType::kBFloat16, ReduceOp::kAverage}, {DataType::kFloat64, ReduceOp::kSum},
    {DataType::kBool, ReduceOp::kMax},        {DataType::kBool, ReduceOp::kProduct},
};

// (ranks, element count, segment bytes)
using Params = std::tuple<int, size_t, size_t>;

class AllreduceTest : public ::testing::TestWithParam<Params> {};

TEST_P(AllreduceTest, MatchesSerialReferenceOnEveryRank) {
  const auto [size, count, segment_bytes] = GetParam();
  for (const Algorithm& algo : kAlgorithms) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(algo.name) + " " + dtype_name(c.dtype) + " " +
                   reduce_op_name(c.op));
      std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) bufs[r] = make_input(c.dtype, r, count);
      run_ranks(size, [&](transport::PointToPointRail& rail) {
        CollectiveOptions opt = test_options(/*seq=*/3, segment_bytes);
        opt.logstep_max_bytes = algo.logstep_max_bytes;
        opt.halving_max_bytes = algo.halving_max_bytes;
        algo.fn(rail, bufs[rail.rank()].data(), count, c.dtype, c.op, opt);
      });
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(nezha::testing::load_value(c.dtype, bufs[r].data(), i),
                    reference_reduction(c.op, c.dtype, size, i))
              << "rank " << r << " element " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksCountsSegments, AllreduceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values(0, 1, 7, 1000),
                       ::testing::Values(size_t(1) << 20, size_t(64), size_t(5))),
    [](const ::testing::TestParamInfo<Params>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_count" +
             std::to_string(std::get<1>(info.param)) + "_seg" +
             std::to_string(std::get<2>(info.param));
    });

// Random float32 data: rounding now depends on the order of additions, and every rank must still
// end with the same bits.
TEST(AllreduceBitIdentical, RandomFloat32SumsAgreeOnEveryRank) {
  for (const Algorithm& algo : kAlgorithms) {
    for (int size : {3, 4, 5}) {
      const size_t count = 10007;
      std::mt19937 rng(static_cast<unsigned>(size));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<std::vector<float>> bufs(static_cast<size_t>(size), std::vector<float>(count));
      std::vector<double> exact(count, 0.0);
      for (auto& b : bufs) {
        for (size_t i = 0; i < count; ++i) {
          b[i] = dist(rng) * (i % 3 == 0 ? 1e6f : 1e-3f);
          exact[i] += b[i];
        }
      }
      run_ranks(size, [&](transport::PointToPointRail& rail) {
        CollectiveOptions opt = test_options(/*seq=*/9, /*segment_bytes=*/1000);
        opt.logstep_max_bytes = algo.logstep_max_bytes;
        opt.halving_max_bytes = algo.halving_max_bytes;
        algo.fn(rail, bufs[rail.rank()].data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
      });
      for (int r = 1; r < size; ++r) {
        ASSERT_EQ(std::memcmp(bufs[0].data(), bufs[r].data(), count * sizeof(float)), 0)
            << algo.name << ": rank " << r << " of " << size << " differs from rank 0";
      }
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(bufs[0][i], exact[i], 1e-6 * size * (i % 3 == 0 ? 1e6 : 1e-3) + 1e-9)
            << algo.name << " element " << i;
      }
    }
  }
}

// Min/Max with NaN are order dependent (std::min semantics); the canonical operand order of the
// log-step algorithm keeps ranks identical anyway.
TEST(AllreduceBitIdentical, NanMinMaxAgreeOnEveryRank) {
  for (const Algorithm& algo : kAlgorithms) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      const int size = 5;
      const size_t count = 64;
      std::vector<std::vector<float>> bufs(size, std::vector<float>(count));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          bufs[r][i] = ((i + r) % 4 == 0) ? std::nanf("") : static_cast<float>(r * 10 + i % 5);
        }
      }
      run_ranks(size, [&](transport::PointToPointRail& rail) {
        CollectiveOptions opt = test_options(1, 32);
        opt.logstep_max_bytes = algo.logstep_max_bytes;
        opt.halving_max_bytes = algo.halving_max_bytes;
        algo.fn(rail, bufs[rail.rank()].data(), count, DataType::kFloat32, op, opt);
      });
      for (int r = 1; r < size; ++r) {
        ASSERT_EQ(std::memcmp(bufs[0].data(), bufs[r].data(), count * sizeof(float)), 0)
            << algo.name << " " << reduce_op_name(op) << ": rank " << r << " differs";
      }
    }
  }
}

// Out of place (a lone tensor reduced from its input into a separate output, as the engine runs
// one): the same bits as in place on every rank, whichever ranks run which way, the input never
// written, and every byte of the output written.
TEST(AllreduceOutOfPlace, SameBitsAsInPlaceAndTheInputIsNeverWritten) {
  for (const Algorithm& algo : kAlgorithms) {
    if (algo.fn == static_cast<AllreduceFn>(allreduce_logstep)) continue;  // in place only
    const bool ring = algo.fn == static_cast<AllreduceFn>(allreduce_ring);
    for (int size : {1, 2, 3, 5}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{10007}}) {
        for (double postscale : {1.0, 0.25}) {
          SCOPED_TRACE(std::string(algo.name) + " ranks " + std::to_string(size) + " count " +
                       std::to_string(count) + " postscale " + std::to_string(postscale));
          std::mt19937 rng(static_cast<unsigned>(size * 31 + count));
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<std::vector<float>> inputs(static_cast<size_t>(size), std::vector<float>(count));
          for (auto& in : inputs)
            for (auto& v : in) v = dist(rng) * 1e3f;
          auto run = [&](std::vector<std::vector<float>>& outs, bool mixed) {
            run_ranks(size, [&](transport::PointToPointRail& rail) {
              CollectiveOptions opt = test_options(/*seq=*/5, /*segment_bytes=*/1000);
              opt.logstep_max_bytes = algo.logstep_max_bytes;
              opt.halving_max_bytes = algo.halving_max_bytes;
              opt.postscale = postscale;
              auto& in = inputs[rail.rank()];
              auto& out = outs[rail.rank()];
              if (mixed && rail.rank() % 2 == 1) {  // odd ranks in place, the others out of place
                out = in;
                allreduce(rail, out.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
              } else if (ring) {
                allreduce_ring(rail, in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
              } else {
                allreduce(rail, in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
              }
            });
          };
          std::vector<std::vector<float>> in_place = inputs;  // reference: every rank in place
          run_ranks(size, [&](transport::PointToPointRail& rail) {
            CollectiveOptions opt = test_options(/*seq=*/5, /*segment_bytes=*/1000);
            opt.logstep_max_bytes = algo.logstep_max_bytes;
            opt.halving_max_bytes = algo.halving_max_bytes;
            opt.postscale = postscale;
            auto& b = in_place[rail.rank()];
            allreduce(rail, b.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
          });
          const std::vector<std::vector<float>> kept = inputs;
          for (bool mixed : {false, true}) {
            // NaN fill: an output byte the algorithm never writes shows as a difference.
            std::vector<std::vector<float>> outs(static_cast<size_t>(size), std::vector<float>(count, std::nanf("")));
            run(outs, mixed);
            for (int r = 0; r < size; ++r) {
              ASSERT_EQ(inputs[r], kept[r]) << "rank " << r << ": the input was written";
              // (an empty vector's data() may be null, which memcmp must not be given)
              if (count > 0)
                ASSERT_EQ(std::memcmp(outs[r].data(), in_place[0].data(), count * sizeof(float)), 0)
                    << "rank " << r << (mixed ? " (mixed)" : "") << " differs from in place";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace nezha::collectives
