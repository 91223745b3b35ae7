// What the rail table learns from shares that waited for late peers: only the rail's own time
// (multirail/share_timing.h), checked against a ring whose cost is computed here from its hop latency
// and link rate.
#include "multirail/share_timing.h"

#include <gtest/gtest.h>

#include <vector>

#include "multirail/rail_table.h"

namespace nezha::multirail {
namespace {

TEST(RailShareSeconds, KeepsTheTimeWithoutCallsToCompare) {
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.030, {}), 0.030);
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.030, {0.029}), 0.030);
}

TEST(RailShareSeconds, TakesOutTheWaitingCallsExcess) {
  // Four calls of 1 ms, one of them waited 30 ms more for its peer; 0.5 ms of local work besides.
  const double total = 0.0005 + 3 * 0.001 + 0.031;
  EXPECT_NEAR(rail_share_seconds(total, {0.001, 0.031, 0.001, 0.001}), 0.0005 + 4 * 0.001, 1e-12);
  // Two of eight calls waited (for two peers), 0.5 ms of local work: both waits come out.
  EXPECT_NEAR(rail_share_seconds(0.0585, {0.001, 0.021, 0.001, 0.001, 0.031, 0.001, 0.001, 0.001}), 0.0085, 1e-12);
  // Two calls (a log-step of four ranks): the faster one is the reference.
  EXPECT_NEAR(rail_share_seconds(0.0251, {0.025, 0.0001}), 0.0002, 1e-12);
}

TEST(RailShareSeconds, KeepsJitterShortWaitsAndAUniformlySlowRail) {
  // Below twice the reference (the upper-quartile call): jitter, kept.
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.0049, {0.001, 0.0019, 0.001, 0.001}), 0.0049);
  // Far above the reference but under the scheduler-slice floor: a hop's latency, kept.
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.00046, {0.00001, 0.0004, 0.00001, 0.00001}), 0.00046);
  // Every call slow (a throttled rail): all of it is the rail's.
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.4, {0.1, 0.1, 0.1, 0.1}), 0.4);
  // A pipelined ring on a paced link: calls alternate between 3 ms and 10 ms; none waited.
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.08, {0.003, 0.010, 0.003, 0.011, 0.003, 0.010}), 0.08);
  // Never negative, never more than the share took.
  EXPECT_GE(rail_share_seconds(0.001, {0.0001, 0.5, 0.0001}), 0.0);
}

// A ring allreduce of `bytes` among `ranks` on a rail of `hop_s` latency and `rate` bytes/s: 2(n-1)
// exchanges of bytes / n each. `late_s` > 0: a peer came that late, and the exchange that needed it
// (call `late_call`) waited that much longer.
struct RingShare {
  double total = 0;
  std::vector<double> calls;
};
RingShare ring_share(size_t bytes, int ranks, double hop_s, double rate, double late_s, int late_call) {
  RingShare s;
  const double call = hop_s + static_cast<double>(bytes) / ranks / rate;
  for (int i = 0; i < 2 * (ranks - 1); ++i) {
    s.calls.push_back(call + (i == late_call ? late_s : 0));
    s.total += s.calls.back();
  }
  return s;
}

constexpr int kRanks = 4;
constexpr double kHopS = 50e-6;
constexpr double kRate = 125e6;  // 1 Gbit/s

const std::vector<size_t>& sizes() {
  static const std::vector<size_t> s = {4096, 16384, 65536, 1 << 20, 4 << 20, 16 << 20, 2 << 20, 8 << 20};
  return s;
}

// Feeds rail `rail` 96 ring shares; with `late_peers` every third one had a peer 20-50 ms late (each
// time at another call). `learn` turns a share into the seconds the table is given.
template <class Learn>
void feed(RailTable& t, int rail, bool late_peers, Learn learn) {
  for (int i = 0; i < 96; ++i) {
    const size_t bytes = sizes()[static_cast<size_t>(i) % sizes().size()];
    const double late = late_peers && i % 3 == 0 ? 0.020 + 0.010 * (i % 4) : 0;
    const RingShare s = ring_share(bytes, kRanks, kHopS, kRate, late, i % (2 * (kRanks - 1)));
    t.observe(rail, bytes, learn(s));
  }
}

RailTable two_rails() { return RailTable({RailDescription{"a"}, RailDescription{"b"}}, RailCostModelOptions{}); }

// The reference: what the model learns from the same shares with every peer on time.
RailEstimate on_time_estimate() {
  RailTable t = two_rails();
  feed(t, 0, false, [](const RingShare& s) { return s.total; });
  return t.estimates()[0];
}

TEST(RailShareSeconds, LatePeersDoNotMoveTheRailsEstimate) {
  RailTable t = two_rails();
  feed(t, 0, true, [](const RingShare& s) { return rail_share_seconds(s.total, s.calls); });
  const RailEstimate e = t.estimates()[0], ref = on_time_estimate();
  ASSERT_TRUE(e.known() && ref.known());
  EXPECT_NEAR(e.alpha_us, ref.alpha_us, 0.01 * ref.alpha_us);
  // A 30 ms wait on 16 MiB shares (calls of 34 ms) stays below the ratio: the model's own outlier
  // damping has to cope with that one, so beta is a little off.
  EXPECT_NEAR(e.beta_gbps, ref.beta_gbps, 0.03 * ref.beta_gbps);
}

TEST(RailShareSeconds, TheWallTimeWouldHaveMovedIt) {
  // The same shares learned from their wall time: the waits become start-up cost (the failure this
  // guards against; if this ever passes as close as the test above, that test proves nothing).
  RailTable t = two_rails();
  feed(t, 0, true, [](const RingShare& s) { return s.total; });
  const RailEstimate e = t.estimates()[0], ref = on_time_estimate();
  ASSERT_TRUE(e.known() && ref.known());
  EXPECT_GT(e.alpha_us, 5 * ref.alpha_us);
  EXPECT_GT(e.beta_gbps, 1.2 * ref.beta_gbps);
}

TEST(RailShareSeconds, WaitsTakenOutLeaveNoLessThanTheFloor) {
  // One call of twelve waited 30 ms: its excess comes out, down to the floor and no further.
  const std::vector<double> calls{0.001, 0.001, 0.031, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001};
  EXPECT_NEAR(rail_share_seconds(0.042, calls), 0.012, 1e-12);
  EXPECT_NEAR(rail_share_seconds(0.042, calls, 0.005), 0.012, 1e-12);  // above the floor: as it was
  EXPECT_NEAR(rail_share_seconds(0.042, calls, 0.020), 0.020, 1e-12);
  EXPECT_NEAR(rail_share_seconds(0.042, calls, 0.100), 0.042, 1e-12);  // never above what it took
  // No wait found: the share's own time, whatever the floor (a rail that got faster is seen).
  EXPECT_DOUBLE_EQ(rail_share_seconds(0.004, {0.001, 0.001, 0.001, 0.001}, 0.010), 0.004);
}

// A ring share on starved ranks: the peers run in bursts, so most calls find their data buffered
// (10 us) and the few that waited for a burst carry the whole transfer: `total` at `bursts` calls.
RingShare starved_share(size_t bytes, int ranks, double rate, int bursts) {
  RingShare s;
  const int n_calls = 2 * (ranks - 1);
  const double transfer = 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes) / rate;
  for (int i = 0; i < n_calls; ++i) s.calls.push_back(i < bursts ? transfer / bursts + 0.040 : 10e-6);
  for (double c : s.calls) s.total += c;
  return s;
}

TEST(RailShareSeconds, BurstsOfStarvedPeersDoNotMakeTheRailLookFaster) {
  // 16 ranks, 1 Gbit/s: after on-time shares, 0.5 MB ranges whose transfer came in 3 bursts of
  // the 30 calls (training's backward pass on 2 cores; 16 testbed hosts).
  const auto learn_starved = [](bool with_floor) {
    RailTable t = two_rails();
    feed(t, 0, false, [](const RingShare& s) { return s.total; });
    for (int i = 0; i < 24; ++i) {
      const size_t bytes = 512 << 10;
      const RingShare s = starved_share(bytes, 16, kRate, 3);
      t.observe(0, bytes, rail_share_seconds(s.total, s.calls, with_floor ? t.own_predicted_seconds(0, bytes) : 0));
    }
    return t.estimates()[0];
  };
  const RailEstimate ref = on_time_estimate(), bounded = learn_starved(true), unbounded = learn_starved(false);
  ASSERT_TRUE(ref.known() && bounded.known() && unbounded.known());
  EXPECT_LE(bounded.beta_gbps, 1.1 * ref.beta_gbps);
  // Without the floor the bursts' calls are taken for waits and the rail for several times faster
  // (the failure this guards against; if this ever holds as close, the test above proves nothing).
  EXPECT_GT(unbounded.beta_gbps, 2 * ref.beta_gbps);
}

TEST(RailShareSeconds, TwoEqualRailsSplitEvenlyWhenOneSawTheLatePeers) {
  // Rail 0 carried the shares whose peers came late, rail 1 the same shares on time: a 24 MiB
  // allreduce must still be split about evenly between the two equal rails.
  RailTable t = two_rails();
  feed(t, 0, true, [](const RingShare& s) { return rail_share_seconds(s.total, s.calls); });
  feed(t, 1, false, [](const RingShare& s) { return s.total; });
  const size_t count = (24 << 20) / 4;
  const Plan plan = t.plan(OpToPlan{count, 4, /*splittable=*/true, /*allreduce=*/true}, PlanSource::kNegotiation);
  std::vector<double> fraction(2, 0.0);
  for (const RailShare& s : plan.shares) fraction[static_cast<size_t>(s.rail)] += static_cast<double>(s.count) / count;
  EXPECT_NEAR(fraction[0], 0.5, 0.05);
  EXPECT_NEAR(fraction[1], 0.5, 0.05);
}

}  // namespace
}  // namespace nezha::multirail
