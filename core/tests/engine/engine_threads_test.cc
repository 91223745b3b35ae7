// Engine end to end, ranks as threads in one process: several Engine objects on loopback exchange
// listen addresses, connect, and run collectives whose results are checked against plain loops.
#include "engine/engine.h"
#include "engine_cluster.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "transport/tcp_mesh.h"

namespace nezha::engine {
namespace {

constexpr double kWaitS = 10;  // longest any single operation may take in these tests

using transport::testing::run_ranks;  // one thread per rank, first exception rethrown

using testing::Cluster;
using testing::loopback_rails;
using testing::memory_rails;
using testing::make_request;

using testing::expect_ok;
using testing::submit;

// Per-rank input for allreduce tests: small integers so float sums are exact in any order.
float float_input(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 23) - 11); }
int32_t int_input(int rank, size_t i) {
  return static_cast<int32_t>((i * 2654435761u + static_cast<size_t>(rank) * 40503u) % 100000) - 50000;
}

void check_float_allreduce(Cluster& c, const std::string& name, size_t count, ReduceOp op) {
  const int n = c.size();
  std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(count, -1));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = float_input(r, i);
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r)
    h[r] = submit(c[r], make_request(OpType::kAllreduce, name, DataType::kFloat32,
                                     {static_cast<int64_t>(count)}, op),
                  in[r].data(), out[r].data());
  for (int r = 0; r < n; ++r) expect_ok(h[r], name + " on rank " + std::to_string(r));
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int r = 0; r < n; ++r) sum += in[r][i];
    const float want = op == ReduceOp::kAverage ? static_cast<float>(sum / n) : static_cast<float>(sum);
    for (int r = 0; r < n; ++r) {
      ASSERT_NEAR(out[r][i], want, 1e-5 * (1 + std::abs(want))) << name << " rank " << r << " index " << i;
      ASSERT_EQ(std::memcmp(&out[r][i], &out[0][i], sizeof(float)), 0) << "ranks differ at " << i;
    }
  }
}

// (ranks, small collectives done by rank 0 inside negotiation or run on the rail, the rail: TCP on
// loopback or the in-memory test rail, both built through the rail factory).
class EngineThreadsTest : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {
 protected:
  static bool control_inline() { return std::get<1>(GetParam()); }
  static bool memory_rail() { return std::get<2>(GetParam()); }
  static Cluster make_cluster() {
    return Cluster(std::get<0>(GetParam()), memory_rail() ? memory_rails(1) : loopback_rails(1), [](EngineConfig& c) {
      c.control_inline_bytes = control_inline() ? 16384 : 0;
    });
  }
};

TEST_P(EngineThreadsTest, AllreduceFloatSumAndAverage) {
  Cluster c = make_cluster();
  check_float_allreduce(c, "sum.small", 7, ReduceOp::kSum);
  check_float_allreduce(c, "sum.large", 300000, ReduceOp::kSum);  // ring path, several segments
  check_float_allreduce(c, "avg", 1000, ReduceOp::kAverage);
  check_float_allreduce(c, "avg.small", 3, ReduceOp::kAverage);
  // Which way they went: the three small ones (up to 4000 bytes) reduced by rank 0, or all on the rail.
  for (int r = 0; r < c.size(); ++r) {
    const uint64_t want = control_inline() ? 3 : 0;
    EXPECT_EQ(c[r].stats().tensors_done_by_coordinator, want) << "rank " << r;
  }
}

// Each engine's background loop runs on a thread named for profiles (top -H, py-spy, /proc).
TEST_P(EngineThreadsTest, LoopThreadsAreNamed) {
  auto named_loops = [] {
    int n = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      if (std::getline(comm, name) && name == "nz-engine") ++n;
    }
    return n;
  };
  const int before = named_loops();
  Cluster c = make_cluster();
  check_float_allreduce(c, "named", 5, ReduceOp::kSum);
  EXPECT_EQ(named_loops() - before, c.size());
}

TEST_P(EngineThreadsTest, AllreduceInt32Max) {
  Cluster c = make_cluster();
  const int n = c.size();
  const size_t count = 5001;
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count)), out(n, std::vector<int32_t>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = int_input(r, i);
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r)
    h[r] = submit(c[r], make_request(OpType::kAllreduce, "imax", DataType::kInt32, {count}, ReduceOp::kMax),
                  in[r].data(), out[r].data());
  for (int r = 0; r < n; ++r) expect_ok(h[r], "imax");
  for (size_t i = 0; i < count; ++i) {
    int32_t want = in[0][i];
    for (int r = 1; r < n; ++r) want = std::max(want, in[r][i]);
    for (int r = 0; r < n; ++r) ASSERT_EQ(out[r][i], want) << "rank " << r << " index " << i;
  }
}

TEST_P(EngineThreadsTest, AllgatherWithDifferentFirstDimensions) {
  Cluster c = make_cluster();
  const int n = c.size();
  const int64_t cols = 3;
  std::vector<std::vector<double>> in(n);
  for (int r = 0; r < n; ++r) {
    const int64_t rows = r + 1 + (r == 1 ? 4 : 0);  // 1, 6, 3, 4 rows
    for (int64_t i = 0; i < rows * cols; ++i) in[r].push_back(r * 1000 + i + 0.5);
  }
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r)
    h[r] = submit(c[r], make_request(OpType::kAllgather, "gather", DataType::kFloat64,
                                     {static_cast<int64_t>(in[r].size()) / cols, cols}),
                  in[r].data(), nullptr);
  std::vector<double> want;
  for (int r = 0; r < n; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
  for (int r = 0; r < n; ++r) {
    expect_ok(h[r], "gather");
    const OpResult& res = h[r]->result();
    EXPECT_EQ(res.output_shape, (std::vector<int64_t>{static_cast<int64_t>(want.size()) / cols, cols}));
    ASSERT_EQ(res.output.size(), want.size() * sizeof(double));
    std::vector<double> got(want.size());
    std::memcpy(got.data(), res.output.data(), res.output.size());
    EXPECT_EQ(got, want) << "rank " << r;
    // At most 144 bytes per rank: gathered by rank 0 within negotiation when that is on.
    EXPECT_EQ(c[r].stats().tensors_done_by_coordinator, control_inline() ? 1u : 0u) << "rank " << r;
  }
}

TEST_P(EngineThreadsTest, BroadcastFromNonZeroRoot) {
  Cluster c = make_cluster();
  const int n = c.size();
  const int root = n - 1;
  for (size_t count : {size_t{20000}, size_t{5}}) {  // on the rail; small enough for rank 0 to relay
    std::vector<std::vector<int64_t>> buf(n, std::vector<int64_t>(count));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) buf[r][i] = (r == root ? 1 : -1) * static_cast<int64_t>(i * i + 3);
    const std::vector<int64_t> want = buf[root];
    const std::string name = "bcast." + std::to_string(count);
    std::vector<std::shared_ptr<OpHandle>> h(n);
    for (int r = 0; r < n; ++r) {
      Request req = make_request(OpType::kBroadcast, name, DataType::kInt64, {static_cast<int64_t>(count)});
      req.root = root;
      h[r] = submit(c[r], req, buf[r].data(), buf[r].data());  // in place, as optimizers do
    }
    for (int r = 0; r < n; ++r) {
      expect_ok(h[r], name);
      EXPECT_EQ(buf[r], want) << name << " rank " << r;
    }
  }
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(c[r].stats().tensors_done_by_coordinator, control_inline() ? 1u : 0u) << "rank " << r;
}

TEST_P(EngineThreadsTest, ManySmallTensorsInDifferentOrdersFuseCorrectly) {
  // Each rank submits the same 24 tensors, concurrently and in its own order, three steps in a row
  // with the same names (the second and third steps go through the response cache).
  Cluster c = make_cluster();
  const int n = c.size();
  const int tensors = 24;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<std::vector<float>>> in(n), out(n);
    std::vector<std::vector<std::shared_ptr<OpHandle>>> h(n, std::vector<std::shared_ptr<OpHandle>>(tensors));
    for (int r = 0; r < n; ++r) {
      in[r].resize(tensors);
      out[r].resize(tensors);
      for (int t = 0; t < tensors; ++t) {
        in[r][t].resize(10 + t * 37);
        for (size_t i = 0; i < in[r][t].size(); ++i) in[r][t][i] = float_input(r + step, i + t);
        out[r][t].assign(in[r][t].size(), 0);
      }
    }
    run_ranks(n, [&](int r) {
      std::vector<int> order(tensors);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(r * 100 + step));
      for (int t : order)
        h[r][t] = submit(c[r], make_request(OpType::kAllreduce, "grad." + std::to_string(t), DataType::kFloat32,
                                            {static_cast<int64_t>(in[r][t].size())}),
                         in[r][t].data(), out[r][t].data());
    });
    for (int r = 0; r < n; ++r)
      for (int t = 0; t < tensors; ++t) expect_ok(h[r][t], "grad." + std::to_string(t));
    for (int t = 0; t < tensors; ++t)
      for (size_t i = 0; i < in[0][t].size(); ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += in[r][t][i];
        for (int r = 0; r < n; ++r) ASSERT_EQ(out[r][t][i], want) << "step " << step << " tensor " << t;
      }
  }
}

TEST_P(EngineThreadsTest, MismatchFailsEveryRankAndNextOpSucceeds) {
  Cluster c = make_cluster();
  const int n = c.size();
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r) {
    const int64_t len = r == 1 ? 6 : 5;
    in[r].assign(len, 1.0f);
    out[r].assign(len, 0.0f);
    h[r] = submit(c[r], make_request(OpType::kAllreduce, "mismatched", DataType::kFloat32, {len}),
                  in[r].data(), out[r].data());
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(h[r]->wait_for(kWaitS)) << "rank " << r;
    const std::string e = h[r]->error();
    EXPECT_NE(e.find("'mismatched'"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
    EXPECT_NE(e.find("[6] on rank 1"), std::string::npos) << e;
  }
  // The engine stays usable, and the failed name may be reused.
  check_float_allreduce(c, "after.mismatch", 100, ReduceOp::kSum);
  check_float_allreduce(c, "mismatched", 5, ReduceOp::kSum);
}

TEST_P(EngineThreadsTest, ShutdownCompletesPromptly) {
  Cluster c = make_cluster();
  check_float_allreduce(c, "warmup", 16, ReduceOp::kSum);
  const double secs = c.shutdown();
  EXPECT_LT(secs, 3.0) << "shutdown of " << c.size() << " ranks took " << secs << " s";
  float x = 0;
  EXPECT_THROW(submit(c[0], make_request(OpType::kAllreduce, "late", DataType::kFloat32, {1}), &x, &x),
               InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Ranks, EngineThreadsTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool, bool>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "ControlInline" : "Rails") +
                                  (std::get<2>(info.param) ? "Memory" : "Tcp");
                         });

TEST(EngineTest, NameInFlightIsRejectedUntilDone) {
  Cluster c(2);
  std::vector<float> a(4, 1), b(4, 2), out0(4), out1(4);
  auto h0 = submit(c[0], make_request(OpType::kAllreduce, "busy", DataType::kFloat32, {4}), a.data(), out0.data());
  EXPECT_THROW(submit(c[0], make_request(OpType::kAllreduce, "busy", DataType::kFloat32, {4}), a.data(), out0.data()),
               InvalidArgument);
  EXPECT_FALSE(h0->wait_for(0.05));  // rank 1 has not submitted it
  auto h1 = submit(c[1], make_request(OpType::kAllreduce, "busy", DataType::kFloat32, {4}), b.data(), out1.data());
  expect_ok(h0, "busy");
  expect_ok(h1, "busy");
  EXPECT_EQ(out0, std::vector<float>(4, 3));
  EXPECT_EQ(out1, std::vector<float>(4, 3));
}

TEST(EngineTest, EnqueueBeforeStartIsInvalidArgument) {
  EngineConfig cfg;
  cfg.rails = loopback_rails(1);
  cfg.secret = "s";
  Engine e(cfg);
  float x = 0;
  EXPECT_THROW(submit(e, make_request(OpType::kAllreduce, "x", DataType::kFloat32, {1}), &x, &x),
               InvalidArgument);
}

TEST(EngineTest, SingleRankAllreduceIsIdentity) {
  Cluster c(1);
  std::vector<float> in{1.5f, -2, 3}, out(3);
  auto h = submit(c[0], make_request(OpType::kAllreduce, "solo", DataType::kFloat32, {3}), in.data(), out.data());
  expect_ok(h, "solo");
  EXPECT_EQ(out, in);
}

TEST(EngineTest, TwoRailsStripeLargePayload) {
  // About striping, not failover: a loaded or sanitized run must not see a rail pause as a failure.
  Cluster c(2, loopback_rails(2), [](EngineConfig& cfg) { cfg.rail_stall_ms = 2000; });
  ASSERT_EQ(c[0].rail_stats().size(), 2u);
  EXPECT_EQ(c[0].rail_stats()[0].name, "a");
  EXPECT_EQ(c[0].rail_stats()[1].name, "b");
  const size_t count = 4 << 20;  // 16 MiB of float32
  std::vector<std::vector<float>> in(2, std::vector<float>(count)), out(2, std::vector<float>(count));
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = float_input(r, i);
  bool striped = false;
  // The cost model learns from every operation, so allow a few attempts before it splits.
  for (int attempt = 0; attempt < 4 && !striped; ++attempt) {
    std::vector<RailStat> before = c[0].rail_stats();
    std::vector<std::shared_ptr<OpHandle>> h(2);
    const std::string name = "big." + std::to_string(attempt);
    for (int r = 0; r < 2; ++r)
      h[r] = submit(c[r], make_request(OpType::kAllreduce, name, DataType::kFloat32, {count}),
                    in[r].data(), out[r].data());
    for (int r = 0; r < 2; ++r) expect_ok(h[r], name);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[0][i], in[0][i] + in[1][i]) << "index " << i;
    EXPECT_EQ(out[0], out[1]);
    std::vector<RailStat> after = c[0].rail_stats();
    const uint64_t grew_a = after[0].bytes_sent - before[0].bytes_sent;
    const uint64_t grew_b = after[1].bytes_sent - before[1].bytes_sent;
    striped = grew_a > count * 4 / 20 && grew_b > count * 4 / 20;
    if (striped) {
      EXPECT_GT(after[0].share, 0.0);
      EXPECT_GT(after[1].share, 0.0);
      EXPECT_NEAR(after[0].share + after[1].share, 1.0, 1e-9);
      EXPECT_GT(after[0].bytes_received, before[0].bytes_received);
      EXPECT_GT(after[1].bytes_received, before[1].bytes_received);
    }
  }
  EXPECT_TRUE(striped) << "a 16 MiB allreduce never used both rails";
  EXPECT_LT(c.shutdown(), 3.0);
}

TEST(EngineTest, JoinLetsOtherRanksAllreduceAndReportsLastJoiner) {
  // Small allreduces reduced by rank 0 inside negotiation, then the same on the rail.
  for (size_t limit : {size_t{16384}, size_t{0}}) {
    SCOPED_TRACE("NEZHA_CONTROL_INLINE_BYTES=" + std::to_string(limit));
    Cluster c(3, loopback_rails(1), [limit](EngineConfig& e) { e.control_inline_bytes = limit; });
    std::vector<std::vector<float>> in(3, std::vector<float>(50)), out(3, std::vector<float>(50));
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < 50; ++i) in[r][i] = float_input(r, i);
    Request join;
    join.type = OpType::kJoin;
    auto j2 = submit(c[2], join, nullptr, nullptr);
    std::vector<std::shared_ptr<OpHandle>> h(2);
    for (int r = 0; r < 2; ++r)
      h[r] = submit(c[r], make_request(OpType::kAllreduce, "uneven", DataType::kFloat32, {50}),
                    in[r].data(), out[r].data());
    for (int r = 0; r < 2; ++r) expect_ok(h[r], "uneven");
    for (size_t i = 0; i < 50; ++i) {
      EXPECT_EQ(out[0][i], in[0][i] + in[1][i]);  // the joined rank contributes zeros
      EXPECT_EQ(out[1][i], out[0][i]);
    }
    EXPECT_FALSE(j2->poll());
    auto j0 = submit(c[0], join, nullptr, nullptr);
    auto j1 = submit(c[1], join, nullptr, nullptr);
    for (const auto& j : {j0, j1, j2}) expect_ok(j, "join");
    const int last = j0->result().last_joined_rank;
    EXPECT_TRUE(last == 0 || last == 1) << last;  // rank 2 joined first
    EXPECT_EQ(j1->result().last_joined_rank, last);
    EXPECT_EQ(j2->result().last_joined_rank, last);
  }
}

TEST(EngineTest, LoneOperationDoesNotWaitForCycleTime) {
  Cluster c(2, loopback_rails(1), [](EngineConfig& cfg) { cfg.cycle_time_ms = 500; });
  check_float_allreduce(c, "warm", 8, ReduceOp::kSum);
  auto start = std::chrono::steady_clock::now();
  check_float_allreduce(c, "lone", 8, ReduceOp::kSum);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 0.25) << "a lone allreduce took " << secs << " s with a 500 ms cycle time";
}

TEST(EngineTest, StalledTensorFailsWithMissingRankAfterStallShutdown) {
  Cluster c(3, loopback_rails(1), [](EngineConfig& cfg) {
    cfg.stall_check_s = 0.2;
    cfg.stall_shutdown_s = 0.4;
  });
  std::vector<float> x(4, 1), y0(4), y1(4);
  auto h0 = submit(c[0], make_request(OpType::kAllreduce, "lonely", DataType::kFloat32, {4}), x.data(), y0.data());
  auto h1 = submit(c[1], make_request(OpType::kAllreduce, "lonely", DataType::kFloat32, {4}), x.data(), y1.data());
  auto start = std::chrono::steady_clock::now();
  for (auto* h : {&h0, &h1}) {
    ASSERT_TRUE((*h)->wait_for(3)) << "stalled tensor never failed";
    const std::string e = (*h)->error();
    EXPECT_NE(e.find("'lonely'"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(secs, 0.3);
  EXPECT_LT(secs, 2.0);
  check_float_allreduce(c, "still.works", 10, ReduceOp::kSum);
}

TEST(EngineTest, ShutdownFailsUnmatchedOperationsInBoundedTime) {
  Cluster c(3);
  std::vector<float> x(4, 1), y(4);
  auto orphan = submit(c[1], make_request(OpType::kAllreduce, "orphan", DataType::kFloat32, {4}), x.data(), y.data());
  const double secs = c.shutdown();
  EXPECT_LT(secs, 3.0);
  ASSERT_TRUE(orphan->poll());
  EXPECT_NE(orphan->error().find("'orphan'"), std::string::npos) << orphan->error();
}

TEST(EngineTest, PrescaleAndPostscaleApplyToSumAndAverage) {
  // Small allreduces reduced by rank 0 inside negotiation, then the same on the rail.
  for (size_t limit : {size_t{16384}, size_t{0}}) {
    SCOPED_TRACE("NEZHA_CONTROL_INLINE_BYTES=" + std::to_string(limit));
    Cluster c(3, loopback_rails(1), [limit](EngineConfig& e) { e.control_inline_bytes = limit; });
    const int n = 3;
    const size_t count = 33;
    std::vector<std::vector<double>> in(n, std::vector<double>(count));
    std::vector<std::vector<std::vector<double>>> out(n, std::vector<std::vector<double>>(2, std::vector<double>(count)));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) in[r][i] = float_input(r, i);
    std::vector<std::shared_ptr<OpHandle>> h;
    for (int r = 0; r < n; ++r)
      for (int t = 0; t < 2; ++t) {
        Request req = make_request(OpType::kAllreduce, "scaled." + std::to_string(t), DataType::kFloat64,
                                   {static_cast<int64_t>(count)}, t == 0 ? ReduceOp::kSum : ReduceOp::kAverage);
        req.prescale = 0.5;
        req.postscale = 3;
        h.push_back(submit(c[r], req, in[r].data(), out[r][t].data()));
      }
    for (auto& x : h) expect_ok(x, "scaled");
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += 0.5 * in[r][i];
      for (int r = 0; r < n; ++r) {
        EXPECT_DOUBLE_EQ(out[r][0][i], 3 * sum) << "sum, rank " << r << " index " << i;
        EXPECT_NEAR(out[r][1][i], 3 * sum / n, 1e-12) << "average, rank " << r << " index " << i;
      }
    }
  }
}

TEST(EngineTest, ReducescatterAndAlltoall) {
  Cluster c(3);
  const int n = 3;
  const int64_t rows = 7, cols = 2;  // 7 rows over 3 ranks: 3, 2, 2
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(rows * cols));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < rows * cols; ++i) in[r][i] = int_input(r, static_cast<size_t>(i)) % 1000;
  std::vector<std::shared_ptr<OpHandle>> rs(n), a2a(n);
  // Alltoall: rank r sends (r + d) % 3 rows to rank d.
  std::vector<std::vector<int64_t>> splits(n);
  std::vector<std::vector<int32_t>> a2a_in(n);
  for (int r = 0; r < n; ++r) {
    int64_t total = 0;
    for (int d = 0; d < n; ++d) total += (splits[r].emplace_back((r + d) % n));
    for (int64_t i = 0; i < total * cols; ++i) a2a_in[r].push_back(r * 100 + static_cast<int32_t>(i));
  }
  for (int r = 0; r < n; ++r) {
    rs[r] = submit(c[r], make_request(OpType::kReducescatter, "rs", DataType::kInt32, {rows, cols}), in[r].data(), nullptr);
    Request req = make_request(OpType::kAlltoall, "a2a", DataType::kInt32,
                               {static_cast<int64_t>(a2a_in[r].size()) / cols, cols});
    req.splits = splits[r];
    a2a[r] = submit(c[r], req, a2a_in[r].data(), nullptr);
  }
  int64_t row0 = 0;
  for (int r = 0; r < n; ++r) {
    expect_ok(rs[r], "rs");
    const int64_t my_rows = rows / n + (r < rows % n ? 1 : 0);
    EXPECT_EQ(rs[r]->result().output_shape, (std::vector<int64_t>{my_rows, cols}));
    std::vector<int32_t> want;
    for (int64_t i = row0 * cols; i < (row0 + my_rows) * cols; ++i) {
      int32_t s = 0;
      for (int q = 0; q < n; ++q) s += in[q][i];
      want.push_back(s);
    }
    row0 += my_rows;
    ASSERT_EQ(rs[r]->result().output.size(), want.size() * sizeof(int32_t));
    std::vector<int32_t> got(want.size());
    std::memcpy(got.data(), rs[r]->result().output.data(), rs[r]->result().output.size());
    EXPECT_EQ(got, want) << "reducescatter rank " << r;
  }
  for (int d = 0; d < n; ++d) {
    expect_ok(a2a[d], "a2a");
    std::vector<int32_t> want;
    std::vector<int64_t> want_splits;
    for (int src = 0; src < n; ++src) {
      int64_t offset = 0;
      for (int k = 0; k < d; ++k) offset += splits[src][k];
      want_splits.push_back(splits[src][d]);
      for (int64_t i = offset * cols; i < (offset + splits[src][d]) * cols; ++i) want.push_back(a2a_in[src][i]);
    }
    const OpResult& res = a2a[d]->result();
    EXPECT_EQ(res.received_splits, want_splits);
    ASSERT_EQ(res.output.size(), want.size() * sizeof(int32_t));
    std::vector<int32_t> got(want.size());
    std::memcpy(got.data(), res.output.data(), res.output.size());
    EXPECT_EQ(got, want) << "alltoall rank " << d;
  }
}

}  // namespace
}  // namespace nezha::engine
