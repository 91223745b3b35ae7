// A caller leading the engine loop (engine.h, point 5; enqueue_all's lead_s): small operations
// complete on the calling thread, the lead ends when the operation leaves negotiation or its time
// is up, the loop thread takes over again afterwards (timers, heartbeats, late answers), and
// leaders, plain callers and the loop thread share the loop safely.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::expect_ok;
using testing::make_request;
using transport::testing::run_ranks;

// A caller leads only while the loop thread sleeps; it may find it running a pass (a timer, a
// message) and then only wakes it. Tests that need a lead retry up to this many times.
constexpr int kTries = 20;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One float allreduce (sum) of `count` elements: input rank + i + 1 at index i.
struct Allreduce {
  Allreduce(int rank, size_t count) : in(count), out(count, -1) {
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + i + 1);
  }
  std::shared_ptr<OpHandle> submit(Engine& e, const std::string& name, double lead_s) {
    return testing::submit_leading(
        e, make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(in.size())}), in.data(),
        out.data(), lead_s);
  }
  // The sum over `size` ranks, as a plain loop computes it.
  void expect_sum(int size, const std::string& what) const {
    for (size_t i = 0; i < in.size(); ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += static_cast<float>(r + i + 1);
      ASSERT_EQ(out[i], want) << what << " index " << i;
    }
  }
  std::vector<float> in, out;
};

TEST(EngineLead, SmallOperationsCompleteOnTheCallingThread) {
  Cluster c(4);
  constexpr int kRounds = 30;
  std::atomic<int> done_on_return{0};
  run_ranks(c.size(), [&](int r) {
    for (int k = 0; k < kRounds; ++k) {
      Allreduce op(r, 3);  // reduced by rank 0 inside negotiation
      auto h = op.submit(c[r], "small." + std::to_string(k), /*lead_s=*/2.0);
      if (h->poll()) ++done_on_return;
      expect_ok(h, "small." + std::to_string(k));
      op.expect_sum(c.size(), "rank " + std::to_string(r) + " round " + std::to_string(k));
    }
  });
  // Not every call leads (see kTries; on rank 0 the loop thread often wakes for the workers'
  // requests first), but many do. Without the lead none is done when enqueue_all returns.
  EXPECT_GE(done_on_return.load(), kRounds * c.size() / 4);
  for (int r = 0; r < c.size(); ++r) EXPECT_GT(c[r].stats().callers_led, 0u) << "rank " << r;
}

TEST(EngineLead, NoLeadWithoutLeadTime) {
  Cluster c(2);
  run_ranks(c.size(), [&](int r) {
    Allreduce op(r, 3);
    expect_ok(op.submit(c[r], "plain", /*lead_s=*/0), "plain");
    op.expect_sum(c.size(), "plain");
  });
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(c[r].stats().callers_led, 0u) << "rank " << r;
}

TEST(EngineLead, RankZeroReturnsOnceItsResultIsSent) {
  // Rank 1's request waits at rank 0; rank 0's leading caller completes the operation within its
  // first passes (its own inline result, in dispatch) and must return then, not at the lead's end.
  Cluster c(2);
  Allreduce op0(0, 2), op1(1, 2);
  bool led = false;
  for (int k = 0; k < kTries && !led; ++k) {
    const std::string name = "first." + std::to_string(k);
    auto h1 = op1.submit(c[1], name, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t leads = c[0].stats().callers_led;
    const auto start = std::chrono::steady_clock::now();
    auto h0 = op0.submit(c[0], name, /*lead_s=*/3.0);
    led = c[0].stats().callers_led > leads;
    if (led) {
      EXPECT_LT(seconds_since(start), 1.0);
      EXPECT_TRUE(h0->poll());
    }
    expect_ok(h0, name + " on rank 0");
    expect_ok(h1, name + " on rank 1");
    op0.expect_sum(2, name + " on rank 0");
    op1.expect_sum(2, name + " on rank 1");
  }
  EXPECT_TRUE(led) << "rank 0's caller never led the loop in " << kTries << " tries";
}

TEST(EngineLead, EndsWhenTheOperationGoesToTheRails) {
  Cluster c(2);
  run_ranks(c.size(), [&](int r) {
    Allreduce op(r, 1 << 18);  // 1 MB: negotiated, then run on the rail by its worker
    const auto start = std::chrono::steady_clock::now();
    auto h = op.submit(c[r], "large", /*lead_s=*/5.0);
    EXPECT_LT(seconds_since(start), 2.5) << "rank " << r << " led past the negotiation";
    expect_ok(h, "large");
    op.expect_sum(c.size(), "large");
  });
}

TEST(EngineLead, TheLoopThreadAnswersWhatArrivesAfterTheLead) {
  Cluster c(2);
  Allreduce late(0, 5), early(1, 5);
  bool led = false;
  for (int k = 0; k < kTries && !led; ++k) {
    const std::string name = "late." + std::to_string(k);
    const uint64_t leads = c[1].stats().callers_led;
    const auto start = std::chrono::steady_clock::now();
    auto h1 = early.submit(c[1], name, /*lead_s=*/0.2);  // rank 0 has not submitted: the lead runs out
    const double lead_took = seconds_since(start);
    led = c[1].stats().callers_led > leads;
    if (led) {
      EXPECT_GE(lead_took, 0.15);
      EXPECT_LT(lead_took, 1.0);
      EXPECT_FALSE(h1->poll());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    const auto submitted = std::chrono::steady_clock::now();
    auto h0 = late.submit(c[0], name, /*lead_s=*/0);
    expect_ok(h0, name + " on rank 0");
    expect_ok(h1, name + " on rank 1");
    // Rank 0's answer reached rank 1 after its lead: its loop thread watches the connections again
    // (an unwatched answer would wait for the loop's idle wake-up, up to a second).
    if (led) EXPECT_LT(seconds_since(submitted), 0.5);
    late.expect_sum(2, name + " on rank 0");
    early.expect_sum(2, name + " on rank 1");
  }
  EXPECT_TRUE(led) << "rank 1's caller never led the loop in " << kTries << " tries";
}

// Rank 1's caller leads while it waits for "x"; another thread of rank 1 submits "y" without
// leading. Both are allreduces of both ranks; rank 0 submits "y" first and "x" late.
struct LeaderBesideAPlainCaller {
  Cluster c{2};
  Allreduce x0{0, 2}, x1{1, 2}, y0{0, 2}, y1{1, 2};
  std::shared_ptr<OpHandle> hx0, hx1, hy0, hy1;

  // Every handle completes and both sums are right.
  void expect_done(const std::string& x, const std::string& y) {
    expect_ok(hy1, y + " on rank 1");
    expect_ok(hx0, x + " on rank 0");
    expect_ok(hx1, x + " on rank 1");
    expect_ok(hy0, y + " on rank 0");
    x1.expect_sum(2, x);
    y1.expect_sum(2, y);
  }
};

TEST(EngineLead, AnotherCallersWorkDuringALeadIsTakenWhenItEnds) {
  // The lead (0.3 s) runs out before rank 0 submits "x". "y" must not wait past the lead (its
  // wake-up is the loop thread's; a leader that swallowed it would leave "y" to the loop's idle
  // wake-up).
  LeaderBesideAPlainCaller t;
  bool led = false;
  for (int k = 0; k < kTries && !led; ++k) {
    const std::string x = "x." + std::to_string(k), y = "y." + std::to_string(k);
    t.hy0 = t.y0.submit(t.c[0], y, 0);
    const uint64_t leads = t.c[1].stats().callers_led;
    const auto start = std::chrono::steady_clock::now();
    std::thread leader([&] { t.hx1 = t.x1.submit(t.c[1], x, /*lead_s=*/0.3); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t.hy1 = t.y1.submit(t.c[1], y, 0);
    leader.join();
    led = t.c[1].stats().callers_led > leads;
    expect_ok(t.hy1, y + " on rank 1");
    if (led) EXPECT_LT(seconds_since(start), 0.3 + 0.4) << y << " waited past the lead";
    t.hx0 = t.x0.submit(t.c[0], x, 0);
    t.expect_done(x, y);
  }
  EXPECT_TRUE(led) << "rank 1's caller never led the loop in " << kTries << " tries";
}

TEST(EngineLead, AnotherCallersWorkEndsALead) {
  // The lead could last 5 s (rank 0 submits "x" only once "y" is done). It ends when "y" wakes the
  // loop thread, so "y" completes at once, not when the leader next hears from a peer.
  LeaderBesideAPlainCaller t;
  bool led = false;
  for (int k = 0; k < kTries && !led; ++k) {
    const std::string x = "x." + std::to_string(k), y = "y." + std::to_string(k);
    t.hy0 = t.y0.submit(t.c[0], y, 0);
    const uint64_t leads = t.c[1].stats().callers_led;
    std::thread leader([&] { t.hx1 = t.x1.submit(t.c[1], x, /*lead_s=*/5.0); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto start = std::chrono::steady_clock::now();
    t.hy1 = t.y1.submit(t.c[1], y, 0);
    while (!t.hy1->poll() && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double y_took = seconds_since(start);
    t.hx0 = t.x0.submit(t.c[0], x, 0);
    leader.join();
    led = t.c[1].stats().callers_led > leads;
    // Without the hand-over "y" waited for the leader's next control message: a heartbeat, ~1 s.
    if (led) EXPECT_LT(y_took, 0.3) << y << " waited for the lead on " << x;
    t.expect_done(x, y);
  }
  EXPECT_TRUE(led) << "rank 1's caller never led the loop in " << kTries << " tries";
}

TEST(EngineLead, HeartbeatsAndTimersGoOnAfterALead) {
  // timeout_s 2.5: a rank whose loop thread stopped reading after a lead would time rank 0 out.
  Cluster c(2, testing::loopback_rails(2), [](EngineConfig& cfg) { cfg.timeout_s = 2.5; });
  auto round = [&](const std::string& name) {
    run_ranks(c.size(), [&](int r) {
      Allreduce op(r, 4);
      expect_ok(op.submit(c[r], name, /*lead_s=*/1.0), name);
      op.expect_sum(c.size(), name + " on rank " + std::to_string(r));
    });
  };
  round("before");
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // idle past timeout_s
  round("after");
  for (int r = 0; r < c.size(); ++r) EXPECT_GT(c[r].stats().callers_led, 0u) << "rank " << r;
}

TEST(EngineLead, LeadersAndPlainCallersShareTheLoop) {
  // Per rank, two threads that lead and one that does not, each with its own names, at once.
  Cluster c(3);
  constexpr int kOps = 40;
  run_ranks(c.size(), [&](int r) {
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t)
      callers.emplace_back([&, t] {
        for (int k = 0; k < kOps; ++k) {
          const std::string name = "t" + std::to_string(t) + "." + std::to_string(k);
          Allreduce op(r, t == 2 ? 5000 : 2);  // the plain caller's: 20 KB, above the inline size
          auto h = op.submit(c[r], name, t == 2 ? 0.0 : 0.5);
          expect_ok(h, name);
          op.expect_sum(c.size(), name);
        }
      });
    for (auto& th : callers) th.join();
  });
}

TEST(EngineLead, ShutdownAfterLeadsIsPrompt) {
  Cluster c(2);
  run_ranks(c.size(), [&](int r) {
    for (int k = 0; k < 5; ++k) {
      Allreduce op(r, 2);
      expect_ok(op.submit(c[r], "s" + std::to_string(k), 1.0), "s");
    }
  });
  EXPECT_LT(c.shutdown(), 3.0);
}

}  // namespace
}  // namespace nezha::engine
