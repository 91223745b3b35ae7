// A leading caller whose operation left negotiation as one rail's task runs that task itself
// (Executor::begin_caller_lead): results as the worker's, the rail order kept among callers and
// the worker, and with failover a rail that fails under the caller's own share is redone on the
// other rail by the loop thread, which the caller no longer holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using transport::testing::run_ranks;

constexpr double kWaitS = 20;

float input(int rank, int step, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5) % 23) - 11);
}

// A synchronous allreduce of `count` floats, led for up to 5 s as the Python API's calls are
// (`waits_to_end`; false: as jit's bounded wait); checks every element against the plain sum.
void led_allreduce(Engine& e, int rank, int size, const std::string& name, int step, size_t count,
                   bool waits_to_end = true) {
  std::vector<float> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = input(rank, step, i);
  TensorEntry t;
  t.req = testing::make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(count)});
  t.input = in.data();
  t.output = out.data();
  std::vector<TensorEntry> one;
  one.push_back(std::move(t));
  auto h = e.enqueue_all(std::move(one), /*lead_s=*/5.0, waits_to_end).at(0);
  ASSERT_TRUE(h->wait_for(kWaitS)) << name << " step " << step << " rank " << rank;
  ASSERT_EQ(h->error(), "") << name << " step " << step << " rank " << rank;
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int q = 0; q < size; ++q) want += input(q, step, i);
    ASSERT_EQ(out[i], want) << name << " step " << step << " rank " << rank << " [" << i << "]";
  }
}

uint64_t run_by_callers(Cluster& c) {
  uint64_t n = 0;
  for (int r = 0; r < c.size(); ++r) n += c[r].stats().shares_run_by_callers;
  return n;
}

TEST(EngineCallerShare, ALeadingCallerRunsItsOperationsShareItself) {
  // 1 MB: above the size run on the loop, so without this it went to the rail's worker.
  Cluster c(3);
  run_ranks(c.size(), [&](int r) {
    for (int step = 0; step < 20; ++step) led_allreduce(c[r], r, c.size(), "big", step, 1 << 18);
  });
  // A caller leads only while the loop thread sleeps; most calls of 20 per rank do.
  EXPECT_GT(run_by_callers(c), 0u);
}

TEST(EngineCallerShare, ACallerWhoseWaitIsBoundedLeavesTheShareToTheWorker) {
  // jit's wait on XLA's thread is bounded (NEZHA_JAX_WAIT_US): a share may wait for a late rank.
  Cluster c(2);
  run_ranks(c.size(), [&](int r) {
    for (int step = 0; step < 10; ++step)
      led_allreduce(c[r], r, c.size(), "big", step, 1 << 18, /*waits_to_end=*/false);
  });
  EXPECT_EQ(run_by_callers(c), 0u);
}

TEST(EngineCallerShare, CallersAndWorkersKeepEachRailsOrder) {
  // Per rank a leading caller and a plain one (its ops go to the worker) on one rail, at once:
  // every operation pairs with the same operation on the other ranks, or results would be wrong.
  Cluster c(3);
  run_ranks(c.size(), [&](int r) {
    std::thread plain([&] {
      for (int step = 0; step < 30; ++step) {
        std::vector<float> in(5000), out(5000, -1);
        for (size_t i = 0; i < in.size(); ++i) in[i] = input(r, 1000 + step, i);
        TensorEntry t;
        t.req = testing::make_request(OpType::kAllreduce, "plain." + std::to_string(step), DataType::kFloat32,
                                      {static_cast<int64_t>(in.size())});
        t.input = in.data();
        t.output = out.data();
        auto h = c[r].enqueue(std::move(t));
        ASSERT_TRUE(h->wait_for(kWaitS)) << "plain." << step << " rank " << r;
        ASSERT_EQ(h->error(), "") << "plain." << step;
        for (size_t i = 0; i < in.size(); ++i) {
          float want = 0;
          for (int q = 0; q < c.size(); ++q) want += input(q, 1000 + step, i);
          ASSERT_EQ(out[i], want) << "plain." << step << " rank " << r << " [" << i << "]";
        }
      }
    });
    for (int step = 0; step < 30; ++step)
      led_allreduce(c[r], r, c.size(), "led." + std::to_string(step), step, 1 << 16);
    plain.join();
  });
}

TEST(EngineCallerShare, WithFailoverACallersShareOnAFailedRailIsRedone) {
  // Two rails, failover on: small shares no longer run on the loop, so callers run them. The rail
  // carrying them fails on rank 1 mid-run; every operation must still be exact, on every rank.
  Cluster c(3, testing::loopback_rails(2), [](EngineConfig& cfg) {
    cfg.timeout_s = 10;
    cfg.rail_stall_ms = 1000;  // loopback on a loaded machine: only the injected error fails over
    // Not re-admitted within the test: a rail failed while its peers waited out the stall limit
    // would be probed and up again before any rank looked.
    cfg.rail_probe_backoff_s = 60;
    cfg.rail_probe_backoff_max_s = 60;
    cfg.rail_failover = true;
    cfg.control_inline_bytes = 0;  // small allreduces must run on the rails
  });
  std::atomic<int> failed{-1};
  std::atomic<bool> seen_down{false};
  std::string moved;  // what rails a and b carried over steps 5-9 on rank 1
  run_ranks(c.size(), [&](int r) {
    std::vector<uint64_t> before;
    bool seen = false;  // the same on every rank: agreed by an allreduce
    for (int step = 0; step < 300 && !(seen && step >= 40); ++step) {
      if (r == 1 && step == 5)
        for (const RailStat& s : c[1].rail_stats()) before.push_back(s.bytes_sent);
      if (r == 1 && step == 10) {
        // The rail the cost model gives these operations to: failing the other would test nothing.
        const std::vector<RailStat> now = c[1].rail_stats();
        const uint64_t moved0 = now[0].bytes_sent - before[0], moved1 = now[1].bytes_sent - before[1];
        const int busy = moved1 > moved0 ? 1 : 0;
        moved = std::to_string(moved0) + " and " + std::to_string(moved1) + " bytes";
        failed = busy;
        c[1].testing_fail_rail(busy, "injected NIC error");
      }
      led_allreduce(c[r], r, c.size(), "small", step, 64);
      // Under load the cost model may move these operations to the other rail for a while: go on
      // until some rank has met the failure (the shares on it then redone), then 30 steps more.
      if (step >= 10 && !seen) {
        const int rail = failed;
        float down = rail >= 0 && c[r].rail_stats()[rail].state != "up" ? 1.0f : 0.0f;
        TensorEntry t;
        t.req = testing::make_request(OpType::kAllreduce, "seen", DataType::kFloat32, {1});
        t.input = &down;
        t.output = &down;
        std::vector<TensorEntry> one;
        one.push_back(std::move(t));
        auto h = c[r].enqueue_all(std::move(one), /*lead_s=*/5.0, /*waits_to_end=*/true).at(0);
        ASSERT_TRUE(h->wait_for(kWaitS)) << "seen, step " << step << " rank " << r;
        ASSERT_EQ(h->error(), "");
        seen = down > 0;
        if (seen) seen_down = true;
      }
    }
  });
  EXPECT_GT(run_by_callers(c), 0u);
  EXPECT_TRUE(seen_down) << "in 300 steps no rank saw rail " << failed << " fail (" << moved << ")";
}

}  // namespace
}  // namespace nezha::engine
