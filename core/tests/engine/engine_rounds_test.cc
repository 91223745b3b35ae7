// Cache rounds end to end, ranks as threads in one process on loopback: repeated steps of cached
// allreduces agree among the ranks without rank 0 (EngineStats says which path ran each tensor) and
// give the same results as plain loops, mixed with everything that still goes through rank 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"
#include "transport/tcp_mesh.h"

namespace nezha::engine {
namespace {

constexpr double kWaitS = 10;

using transport::testing::run_ranks;

using testing::loopback_rails;
using testing::make_request;

// The shared test cluster with cache rounds on (a tweak may turn them off again).
class Cluster : public testing::Cluster {
 public:
  explicit Cluster(int size, std::vector<RailConfig> rails = loopback_rails(1),
                   const std::function<void(EngineConfig&)>& tweak = {})
      : testing::Cluster(size, std::move(rails), [&tweak](EngineConfig& c) {
          c.cache_rounds = true;
          if (tweak) tweak(c);
        }) {}
};

Request float_allreduce(const std::string& name, size_t count) {
  return make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(count)});
}

using testing::expect_ok;
using testing::submit;

// Small integers: float sums are exact in any order.
float input(int rank, int step, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5) % 23) - 11);
}

// One step: every rank allreduces `counts.size()` tensors named prefix.i, in its own order.
// Checks every output against the sum of the inputs.
void run_step(Cluster& c, const std::string& prefix, const std::vector<size_t>& counts, int step,
              const std::vector<bool>& joined = {}) {
  const int n = c.size();
  const size_t k = counts.size();
  std::vector<std::vector<std::vector<float>>> in(n), out(n);
  std::vector<std::vector<std::shared_ptr<OpHandle>>> h(n, std::vector<std::shared_ptr<OpHandle>>(k));
  for (int r = 0; r < n; ++r) {
    in[r].resize(k);
    out[r].resize(k);
    for (size_t t = 0; t < k; ++t) {
      for (size_t i = 0; i < counts[t]; ++i) in[r][t].push_back(input(r, step, i + t));
      out[r][t].assign(counts[t], -999);
    }
  }
  auto takes_part = [&](int r) { return joined.empty() || !joined[r]; };
  run_ranks(n, [&](int r) {
    if (!takes_part(r)) return;
    std::vector<size_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(r * 1000 + step));
    for (size_t t : order)
      h[r][t] = submit(c[r], float_allreduce(prefix + "." + std::to_string(t), counts[t]),
                       in[r][t].data(), out[r][t].data());
  });
  for (int r = 0; r < n; ++r)
    if (takes_part(r))
      for (size_t t = 0; t < k; ++t) expect_ok(h[r][t], prefix + "." + std::to_string(t));
  for (size_t t = 0; t < k; ++t)
    for (size_t i = 0; i < counts[t]; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r)
        if (takes_part(r)) want += in[r][t][i];
      for (int r = 0; r < n; ++r)
        if (takes_part(r))
          ASSERT_EQ(out[r][t][i], want) << prefix << "." << t << " step " << step << " rank " << r
                                        << " index " << i;
    }
}

class EngineRoundsTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineRoundsTest, RepeatedCachedStepsSkipRankZero) {
  Cluster c(GetParam());
  const int n = c.size();
  const std::vector<size_t> counts{1, 7, 100, 3000, 70000};  // log-step and ring sizes
  run_step(c, "grad", counts, 0);  // negotiated by rank 0, cached
  std::vector<EngineStats> first(n);
  for (int r = 0; r < n; ++r) {
    first[r] = c[r].stats();
    EXPECT_EQ(first[r].tensors_via_coordinator, counts.size()) << "rank " << r;
    EXPECT_EQ(first[r].tensors_via_rounds, 0u) << "rank " << r;
  }
  const int steps = 6;
  for (int step = 1; step <= steps; ++step) run_step(c, "grad", counts, step);
  for (int r = 0; r < n; ++r) {
    EngineStats s = c[r].stats();
    EXPECT_EQ(s.tensors_via_coordinator, first[r].tensors_via_coordinator) << "rank " << r;
    EXPECT_EQ(s.requests_to_coordinator, first[r].requests_to_coordinator)
        << "rank " << r << " still sent requests to rank 0";
    EXPECT_EQ(s.tensors_via_rounds, counts.size() * steps) << "rank " << r;
    EXPECT_GE(s.rounds, static_cast<uint64_t>(steps)) << "rank " << r;
  }
  EXPECT_LT(c.shutdown(), 3.0);
}

TEST_P(EngineRoundsTest, SubmittingInDifferentOrdersAndWaitingDoesNotDeadlock) {
  Cluster c(GetParam());
  const int n = c.size();
  std::vector<std::vector<float>> x(n, std::vector<float>(10)), y(n, std::vector<float>(10));
  std::vector<std::vector<float>> ox(n, std::vector<float>(10)), oy(n, std::vector<float>(10));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < 10; ++i) x[r][i] = input(r, 0, i), y[r][i] = input(r, 1, i);
  for (int step = 0; step < 5; ++step) {
    // Rank 0 submits X then Y; the last rank submits Y, waits for it, then X; the others Y then X.
    run_ranks(n, [&](int r) {
      std::shared_ptr<OpHandle> hx, hy;
      if (r == 0) {
        hx = submit(c[r], float_allreduce("X", 10), x[r].data(), ox[r].data());
        hy = submit(c[r], float_allreduce("Y", 10), y[r].data(), oy[r].data());
      } else if (r == n - 1) {
        hy = submit(c[r], float_allreduce("Y", 10), y[r].data(), oy[r].data());
        expect_ok(hy, "Y before X");
        hx = submit(c[r], float_allreduce("X", 10), x[r].data(), ox[r].data());
      } else {
        hy = submit(c[r], float_allreduce("Y", 10), y[r].data(), oy[r].data());
        hx = submit(c[r], float_allreduce("X", 10), x[r].data(), ox[r].data());
      }
      expect_ok(hx, "X rank " + std::to_string(r));
      expect_ok(hy, "Y rank " + std::to_string(r));
    });
    for (size_t i = 0; i < 10; ++i) {
      float wx = 0, wy = 0;
      for (int r = 0; r < n; ++r) wx += x[r][i], wy += y[r][i];
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(ox[r][i], wx) << "step " << step;
        ASSERT_EQ(oy[r][i], wy) << "step " << step;
      }
    }
  }
  EXPECT_GE(c[0].stats().tensors_via_rounds, 8u);
}

TEST_P(EngineRoundsTest, ShapeChangeRenegotiatesAndMismatchFailsEveryRank) {
  Cluster c(GetParam());
  const int n = c.size();
  run_step(c, "w", {5}, 0);
  run_step(c, "w", {5}, 1);  // cached: rounds
  run_step(c, "w", {7}, 2);  // every rank changes the shape: invalidated, renegotiated
  const uint64_t rounds_before = c[0].stats().tensors_via_rounds;
  run_step(c, "w", {7}, 3);  // cached again under the new shape
  EXPECT_EQ(c[0].stats().tensors_via_rounds, rounds_before + 1);
  // Rank 1 alone changes the shape: the others had it pending on the round path.
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r) {
    const size_t len = r == 1 ? 9 : 7;
    in[r].assign(len, 1.0f);
    out[r].assign(len, 0.0f);
    h[r] = submit(c[r], float_allreduce("w.0", len), in[r].data(), out[r].data());
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(h[r]->wait_for(kWaitS)) << "rank " << r << ": mismatch never reported";
    const std::string e = h[r]->error();
    EXPECT_NE(e.find("'w.0'"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
    EXPECT_NE(e.find("[9] on rank 1"), std::string::npos) << e;
  }
  run_step(c, "w", {7}, 4);  // usable again, and renegotiated
  run_step(c, "w", {7}, 5);
}

TEST_P(EngineRoundsTest, CachedAllreducesMixWithOtherOperations) {
  Cluster c(GetParam());
  const int n = c.size();
  const size_t len = 300;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<float>> a(n, std::vector<float>(len)), oa(n, std::vector<float>(len));
    std::vector<std::vector<float>> e(n, std::vector<float>(len)), oe(n, std::vector<float>(len));
    std::vector<std::vector<float>> d(n, std::vector<float>(len)), od(n, std::vector<float>(len));
    std::vector<std::vector<int64_t>> b(n, std::vector<int64_t>(len));
    std::vector<std::vector<double>> g(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < len; ++i) {
        a[r][i] = input(r, step, i);
        e[r][i] = input(r, step + 3, i);
        d[r][i] = input(r, step + 7, i);
        b[r][i] = (r == 1 % n ? 1 : -1) * static_cast<int64_t>(i * 3 + step);
      }
      for (int i = 0; i < (r + step) % 3 + 1; ++i) g[r].push_back(r * 100 + i + step * 0.5);
    }
    const std::vector<int64_t> want_b = b[1 % n];
    std::vector<std::vector<std::shared_ptr<OpHandle>>> h(n);
    run_ranks(n, [&](int r) {
      std::vector<std::function<std::shared_ptr<OpHandle>()>> ops{
          [&] { return submit(c[r], float_allreduce("a", len), a[r].data(), oa[r].data()); },
          [&] {
            Request q = make_request(OpType::kBroadcast, "b", DataType::kInt64, {static_cast<int64_t>(len)});
            q.root = 1 % n;
            return submit(c[r], q, b[r].data(), b[r].data());
          },
          [&] {
            return submit(c[r], make_request(OpType::kAllgather, "g", DataType::kFloat64,
                                             {static_cast<int64_t>(g[r].size())}),
                          g[r].data(), nullptr);
          },
          [&] {  // a new name every step: always negotiated by rank 0
            return submit(c[r], float_allreduce("d." + std::to_string(step), len), d[r].data(), od[r].data());
          },
          [&] { return submit(c[r], float_allreduce("e", len), e[r].data(), oe[r].data()); },
      };
      std::vector<size_t> order(ops.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(r * 31 + step));
      h[r].resize(ops.size());
      for (size_t i : order) h[r][i] = ops[i]();
    });
    for (int r = 0; r < n; ++r)
      for (auto& x : h[r]) expect_ok(x, "mixed step " + std::to_string(step));
    std::vector<double> want_g;
    for (int r = 0; r < n; ++r) want_g.insert(want_g.end(), g[r].begin(), g[r].end());
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(b[r], want_b) << "broadcast rank " << r;
      const OpResult& res = h[r][2]->result();
      ASSERT_EQ(res.output.size(), want_g.size() * sizeof(double));
      EXPECT_EQ(std::memcmp(res.output.data(), want_g.data(), res.output.size()), 0) << "allgather rank " << r;
    }
    for (size_t i = 0; i < len; ++i) {
      float wa = 0, we = 0, wd = 0;
      for (int r = 0; r < n; ++r) wa += a[r][i], we += e[r][i], wd += d[r][i];
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(oa[r][i], wa) << "a step " << step;
        ASSERT_EQ(oe[r][i], we) << "e step " << step;
        ASSERT_EQ(od[r][i], wd) << "d step " << step;
      }
    }
  }
  EXPECT_GE(c[0].stats().tensors_via_rounds, 8u);  // a and e from step 1 on
}

TEST_P(EngineRoundsTest, ShutdownPromptlyWithCachedWorkUnmatched) {
  Cluster c(GetParam());
  run_step(c, "u", {4}, 0);
  std::vector<float> x(4, 1), y(4);
  auto orphan = submit(c[0], float_allreduce("u.0", 4), x.data(), y.data());  // cached, alone
  EXPECT_FALSE(orphan->wait_for(0.1));
  EXPECT_LT(c.shutdown(), 3.0);
  ASSERT_TRUE(orphan->poll());
  EXPECT_NE(orphan->error().find("'u.0'"), std::string::npos) << orphan->error();
}

INSTANTIATE_TEST_SUITE_P(Ranks, EngineRoundsTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(EngineRoundsJoinTest, JoinWithCachedAllreducesInFlight) {
  Cluster c(3);
  run_step(c, "j", {50, 3}, 0);
  run_step(c, "j", {50, 3}, 1);  // cached
  Request join;
  join.type = OpType::kJoin;
  for (int round = 0; round < 3; ++round) {
    // Rank 2 has joined; ranks 0 and 1 keep stepping on cached names (rank 2 contributes zeros).
    auto j2 = submit(c[2], join, nullptr, nullptr);
    run_step(c, "j", {50, 3}, 2 + round, {false, false, true});
    EXPECT_FALSE(j2->poll());
    // Rank 0 submits a cached allreduce and joins at once; rank 1 only joins.
    std::vector<float> x(50, 2), y(50);
    auto h0 = submit(c[0], float_allreduce("j.0", 50), x.data(), y.data());
    auto j0 = submit(c[0], join, nullptr, nullptr);
    auto j1 = submit(c[1], join, nullptr, nullptr);
    expect_ok(h0, "j.0 with ranks 1 and 2 joined");
    EXPECT_EQ(y, std::vector<float>(50, 2));
    for (const auto& j : {j0, j1, j2}) expect_ok(j, "join");
    EXPECT_EQ(j0->result().last_joined_rank, j2->result().last_joined_rank);
    run_step(c, "j", {50, 3}, 10 + round);  // everyone again, cached
  }
  EXPECT_GT(c[2].stats().tensors_via_rounds, 6u);
}

TEST(EngineRoundsTest2, OffByKnobUsesRankZeroOnly) {
  Cluster c(3, loopback_rails(1), [](EngineConfig& cfg) { cfg.cache_rounds = false; });
  for (int step = 0; step < 3; ++step) run_step(c, "k", {10, 1000}, step);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(c[r].stats().tensors_via_rounds, 0u);
    EXPECT_EQ(c[r].stats().tensors_via_coordinator, 6u);
  }
}

TEST(EngineRoundsTest2, TwoRailsPlanCachedLargePayloadsIdentically) {
  // Every rank plans round ops itself from rank 0's estimates: a different split on one rank would
  // mis-pair the collectives and time out.
  Cluster c(3, loopback_rails(2));
  const std::vector<size_t> counts{2 << 20, 1000};  // 8 MiB: striped and probed
  for (int step = 0; step < 6; ++step) run_step(c, "big", counts, step);
  EXPECT_EQ(c[1].stats().tensors_via_rounds, 10u);
  auto stats = c[1].rail_stats();
  EXPECT_GT(stats[0].bytes_sent, 0u);
  EXPECT_GT(stats[1].bytes_sent, 0u);
  EXPECT_LT(c.shutdown(), 3.0);
}

}  // namespace
}  // namespace nezha::engine
