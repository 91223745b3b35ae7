// Balanced allreduces end to end (share_balancer.h): ranks as threads, two in-memory rails one of
// which is slowed (after the plan was made, or while the operation runs). The slowed rail must end
// up carrying less than its planned half, every rank must get the exact sum, and with balancing off
// the same run keeps the planned split (so the check above can fail).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/memory_rail.h"
#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;

constexpr size_t kCount = 8 << 20;  // 32 MiB of float32: shares of ~16 MiB on two equal rails

std::vector<RailConfig> two_memory_rails() { return testing::memory_rails(2); }

Cluster make_job(const std::vector<RailConfig>& rails, size_t balance_bytes) {
  return Cluster(4, rails, [=](EngineConfig& c) {
    c.timeout_s = 30;
    c.rail_stall_ms = 5000;  // a slowed rail is slow, not failed
    c.balance_bytes = balance_bytes;
    c.control_inline_bytes = 0;
  });
}

// Runs one checked allreduce (testing::allreduce_and_check) and returns, per rank, the fraction of
// its bytes sent during it that went over rail 1. `during` runs on another thread while it does.
std::vector<double> rail1_fraction(Cluster& c, const std::string& name,
                                   const std::function<void()>& during = {}) {
  auto before0 = testing::bytes_sent(c, 0), before1 = testing::bytes_sent(c, 1);
  std::thread side;
  if (during) side = std::thread(during);
  testing::allreduce_and_check(c, name, kCount);
  if (side.joinable()) side.join();
  auto after0 = testing::bytes_sent(c, 0), after1 = testing::bytes_sent(c, 1);
  std::vector<double> out;
  for (int r = 0; r < c.size(); ++r) {
    const double d0 = static_cast<double>(after0[r] - before0[r]), d1 = static_cast<double>(after1[r] - before1[r]);
    out.push_back(d1 / (d0 + d1));
  }
  return out;
}

struct Split {
  double warmed_up;  // rail 1's fraction in the last operation before the slowdown
  double slowed;     // and in the operation it was slowed in (or before)
};

// Both rails paced alike, warmed up (the cost models learn the pace), then rail 1 slowed 16x. The
// pace is a sleep per send, and a loaded machine wakes every sleeper late by about the same time:
// at 8x the same design's broadcast ended at the planned split once under ASan in CI
// (balanced_striped_test.cc).
Split run_with_rail1_slowed(size_t balance_bytes, bool mid_operation) {
  auto rails = two_memory_rails();
  Cluster c = make_job(rails, balance_bytes);
  auto w0 = testing::memory_world(rails, 0), w1 = testing::memory_world(rails, 1);
  w0->set_send_pace(10);  // ~100 MB/s per rank and rail
  w1->set_send_pace(10);
  Split split{};
  for (int i = 0; i < 4; ++i) split.warmed_up = rail1_fraction(c, "warm-up")[0];
  std::function<void()> during;
  if (mid_operation) {
    // Rail 1 slows down once the operation has moved some data on it.
    during = [&c, w1, start = testing::bytes_sent(c, 1)[0]] {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (c[0].rail_stats()[1].bytes_sent < start + (4u << 20) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      w1->set_send_pace(160);
    };
  } else {
    w1->set_send_pace(160);
  }
  auto frac = rail1_fraction(c, "slowed", during);
  for (int r = 1; r < c.size(); ++r) EXPECT_NEAR(frac[r], frac[0], 0.02) << "every rank runs the same ranges";
  split.slowed = frac[0];
  return split;
}

TEST(BalancedAllreduceTest, ARailSlowedAfterPlanningCarriesLessAndResultsStayExact) {
  const Split split = run_with_rail1_slowed(256 << 10, /*mid_operation=*/false);
  // Equal rails end even whatever the plan said; slowed, it carries its first range (half its share)
  // and little more (0.25 here); the planned split keeps ~0.5 (WithBalancingOffTheSlowedRailKeeps...).
  // Under ThreadSanitizer the instrumented copies and reductions, not the paced sends, set both
  // rails' speed, and the split measured 0.38-0.46: there only exactness and agreement are checked.
  EXPECT_NEAR(split.warmed_up, 0.5, 0.1);
#ifndef __SANITIZE_THREAD__
  EXPECT_LT(split.slowed, 0.38) << "the slowed rail kept too much of its share";
#endif
  EXPECT_GT(split.slowed, 0.1);
}

TEST(BalancedAllreduceTest, WithBalancingOffTheSlowedRailKeepsItsPlannedShare) {
  const Split split = run_with_rail1_slowed(0, /*mid_operation=*/false);
  EXPECT_NEAR(split.slowed, split.warmed_up, 0.12) << "the plan (learned from the warm-up) decides alone";
}

TEST(BalancedAllreduceTest, ARailSlowedWhileTheOperationRunsHandsItsRestToTheOther) {
  const Split split = run_with_rail1_slowed(256 << 10, /*mid_operation=*/true);
  EXPECT_NEAR(split.warmed_up, 0.5, 0.1);
  // Looser than above: where the slowdown lands in the operation depends on the machine's speed
  // (0.25 here, 0.38 under ThreadSanitizer); the planned split keeps ~0.5.
  EXPECT_LT(split.slowed, 0.45) << "the rail slowed mid-operation kept too much of its share";
}

TEST(BalancedAllreduceTest, AProcessSetsAllreduceIsBalancedAmongItsMembers) {
  auto rails = two_memory_rails();
  Cluster c = make_job(rails, 64 << 10);
  std::vector<int> members = {1, 2, 3};
  int32_t set = -1;
  for (int r = 0; r < c.size(); ++r) set = c[r].add_process_set(members);
  const size_t count = 1 << 20;
  std::vector<std::vector<float>> in(4, std::vector<float>(count)), out(4, std::vector<float>(count, -1));
  std::vector<std::shared_ptr<OpHandle>> h(4);
  for (int r : members) {
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<float>((i * 5 + r * 3) % 29) - 14.0f;
    auto req = testing::make_request(OpType::kAllreduce, "set-grad", DataType::kFloat32, {static_cast<int64_t>(count)},
                                     ReduceOp::kAverage);
    req.process_set = set;
    h[r] = testing::submit(c[r], req, in[r].data(), out[r].data());
  }
  for (int r : members) testing::expect_ok(h[r], "rank " + std::to_string(r), 30);
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int q : members) want += in[q][i];
    want /= 3;
    for (int r : members) ASSERT_EQ(out[r][i], out[1][i]) << "rank " << r << " [" << i << "] differs from rank 1";
    ASSERT_NEAR(out[1][i], want, 1e-5) << "[" << i << "]";
  }
}

}  // namespace
}  // namespace nezha::engine
