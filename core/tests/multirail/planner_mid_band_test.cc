// The planner's mid band (planner.h: Mid band) and the cost model's fit of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/error.h"
#include "multirail/planner.h"
#include "multirail/rail_table.h"
#include "multirail/split_regime_model.h"

namespace nezha::multirail {
namespace {

RailEstimate with_mid(double alpha_us, double beta_gbps, double mid_alpha_us, double mid_beta_gbps) {
  return RailEstimate{alpha_us, beta_gbps, 100, 0, mid_alpha_us, mid_beta_gbps};
}

// A share's price in a mid-band plan (planner.h: Mid band): above kLatencyBoundBytes the rail's
// mid-band fit (its bulk price without one), else the log-step's latency price.
double share_seconds(const RailEstimate& e, double bytes) {
  if (bytes <= double(kLatencyBoundBytes)) return e.alpha_us * 1e-6 + bytes * 8 / (e.beta_gbps * 1e9);
  if (!e.mid_known()) return std::max(e.alpha_us, e.bulk_alpha_us) * 1e-6 + bytes * 8 / (e.beta_gbps * 1e9);
  return e.mid_alpha_us * 1e-6 + bytes * 8 / (e.mid_beta_gbps * 1e9);
}

// Rank 0 of 16 testbed hosts, 1 + 0.25 Gbit/s, after 256 KB calls (benchmarks/SCALE.md): a share's
// time on the rail, not the call's. Rail 0's small payloads take 1.3 ms; its 256 KB shares run at
// 2.6 Gbit/s past that (halving/doubling's messages fit the shaper's bucket, which refills while
// the ranks negotiate); its ring (calibrated at 0.5-2 MB) 0.48 Gbit/s. Rail 1 has not carried the
// band.
std::vector<RailEstimate> sixteen_hosts() {
  return {with_mid(1297, 0.481, 1297, 2.6), RailEstimate{1471, 0.132, 100}};
}

TEST(PlanMidBand, SixteenHostsKeep256KBOnTheFastRailWhereTheBulkPricesStripedIt) {
  const size_t count = (256 << 10) / 4;
  std::vector<RailEstimate> rails = sixteen_hosts();
  Plan plan = plan_split(PlanRequest{count, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 1u) << plan.why;
  EXPECT_EQ(plan.shares[0].rail, 0) << plan.why;
  // Without the mid band's fit the ring's prices (rail 0 alone 5.7 ms) split it ~79/21, as the
  // engine did, taking 5.4-5.9 ms where rail 0 alone takes 4.0.
  rails[0].mid_alpha_us = rails[0].mid_beta_gbps = 0;
  plan = plan_split(PlanRequest{count, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_NEAR(double(plan.shares[0].count) / count, 0.79, 0.02);
  // An unusable rail is no lane at all.
  plan = plan_split(PlanRequest{count, 4, sixteen_hosts(), {true, false}});
  ASSERT_EQ(plan.shares.size(), 1u);
  EXPECT_EQ(plan.shares[0].rail, 0);
}

TEST(PlanMidBand, AShareBelowTheBandIsPricedAsTheLogStepItRuns) {
  // 4 hosts, 1 + 0.25 Gbit/s: 150 us start-ups. 256 KB on rail 0 alone: 2.5 ms; rail 1 can carry
  // ~46 KB (a log-step: its latency price) in the 2.1 ms rail 0 then needs for the rest.
  const std::vector<RailEstimate> rails{with_mid(150, 0.75, 150, 0.9), RailEstimate{150, 0.19, 100}};
  const size_t count = (256 << 10) / 4;
  const Plan plan = plan_split(PlanRequest{count, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_LE(plan.shares[1].count * 4, kLatencyBoundBytes);
  const double level = share_seconds(rails[0], double(plan.shares[0].count) * 4);
  EXPECT_NEAR(share_seconds(rails[1], double(plan.shares[1].count) * 4), level, 5e-6);  // 64 B units
  EXPECT_LT(level, 0.95 * share_seconds(rails[0], double(count) * 4));
}

TEST(PlanMidBand, EqualRailsSplitWithEachSharePricedByItsBand) {
  const std::vector<RailEstimate> rails{with_mid(50, 1, 100, 1), with_mid(50, 1, 100, 1)};
  // 256 KB: 128 KB each by the mid-band fits, 1.15 ms against 2.2 ms alone.
  Plan plan = plan_split(PlanRequest{(256 << 10) / 4, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_NEAR(double(plan.shares[0].count), double(plan.shares[1].count), 32);  // 64-byte units
  // 100 KB: two 50 KB log-steps at the latency price (0.46 ms) against 0.92 ms alone.
  plan = plan_split(PlanRequest{100 << 8, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_NEAR(share_seconds(rails[0], double(plan.shares[0].count) * 4), 459.6e-6, 1e-6);
}

TEST(PlanMidBand, ARailBouncingAcrossTheBoundaryIsHeldThereNotDropped) {
  // 6 hosts x 1 + 1 Gbit/s (the simulator's table after 300 calls): 145 / 175 us start-ups, 0.9
  // Gbit/s rings, 0.44 Gbit/s halving/doubling. 128 KB by the mid prices: 66.4 / 64.7 KB, so rail 1
  // runs the log-step; at that price it would take 87 KB (the mid band again) and rail 0 44 KB.
  // Holding rail 1 at 64 KiB leaves rail 0 the other 64 KiB: two log-steps, ~0.76 ms predicted,
  // where 128 KB alone on rail 0 is 2.5 ms (on the testbed: 1.7 against 2.8 ms).
  const std::vector<RailEstimate> rails{with_mid(145, 0.9, 145, 0.44), with_mid(175, 0.9, 175, 0.44)};
  Plan plan = plan_split(PlanRequest{(128 << 10) / 4, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_EQ(plan.shares[0].count * 4, kLatencyBoundBytes) << plan.why;
  EXPECT_EQ(plan.shares[1].count * 4, kLatencyBoundBytes) << plan.why;
  EXPECT_NE(plan.why.find("held at 65536 B"), std::string::npos) << plan.why;
  // 12 bytes more than two boundaries: the held share leaves room for the buffer's sub-unit tail
  // (so it still runs the log-step), and the rail left with the rest, now past the boundary, takes
  // it at its mid price.
  const size_t odd = (128 << 10) / 4 + 3;
  plan = plan_split(PlanRequest{odd, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_EQ(plan.shares[0].count + plan.shares[1].count, odd);
  EXPECT_EQ(plan.shares[1].count * 4, kLatencyBoundBytes - 64 + 12) << plan.why;
  EXPECT_EQ(plan.shares[1].offset * 4 % 64, 0u);
  EXPECT_GT(plan.shares[0].count * 4, kLatencyBoundBytes) << plan.why;
  // 160 KB: no share near the boundary, both by their mid prices.
  plan = plan_split(PlanRequest{(160 << 10) / 4, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_EQ(plan.why.find("held"), std::string::npos) << plan.why;
}

TEST(PlanMidBand, ARailWithoutAMidFitIsPricedByItsBulkPrice) {
  // A rail that has not carried the band is priced by its ring's prices there (it gets a fit once
  // it takes a share); while no rail has a fit, the bulk prices alone plan the payload.
  std::vector<RailEstimate> rails{with_mid(100, 1, 100, 1), RailEstimate{100, 1, 100}};
  const size_t count = (256 << 10) / 4;
  Plan plan = plan_split(PlanRequest{count, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  EXPECT_NEAR(double(plan.shares[0].count), double(plan.shares[1].count), 32);
  rails[1].bulk_alpha_us = 5000;  // a ring at scale: its share would start after rail 0 is done
  plan = plan_split(PlanRequest{count, 4, rails, {true, true}});
  ASSERT_EQ(plan.shares.size(), 1u) << plan.why;
  rails[0].mid_alpha_us = rails[0].mid_beta_gbps = 0;
  EXPECT_EQ(plan_split(PlanRequest{count, 4, rails, {true, true}}).why.find("mid band"), std::string::npos);
}

TEST(PlanMidBand, PayloadsOutsideTheBandKeepTheirPrices) {
  const std::vector<RailEstimate> rails = sixteen_hosts();
  // 512 KB is the ring's: priced 1297 us + 512 KiB at 0.481 Gbit/s on rail 0, not by its mid fit.
  EXPECT_NEAR(predicted_seconds(rails[0], 512 << 10), 1297e-6 + (512 << 10) * 8 / 0.481e9, 1e-12);
  EXPECT_NEAR(predicted_seconds(rails[0], 256 << 10), 1297e-6 + (256 << 10) * 8 / 2.6e9, 1e-12);
  EXPECT_NEAR(predicted_seconds(rails[0], 4096), 1297e-6 + 4096 * 8 / 0.481e9, 1e-12);
  EXPECT_NEAR(predicted_seconds(rails[1], 256 << 10), 1471e-6 + (256 << 10) * 8 / 0.132e9, 1e-12);
  EXPECT_THROW(predicted_seconds(RailEstimate{}, 4096), InvalidArgument);
  // Exactly kLatencyBoundBytes still runs the log-step (the executor's logstep_max_bytes).
  EXPECT_FALSE(in_mid_band(kLatencyBoundBytes));
  EXPECT_TRUE(in_mid_band(kLatencyBoundBytes + 1));
  EXPECT_TRUE(in_mid_band(kMidBandMaxBytes));
  EXPECT_FALSE(in_mid_band(kMidBandMaxBytes + 1));
}

TEST(PlanMidBand, RandomRequestsAreNeverPredictedSlowerThanTheBestRailAlone) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> alpha(0, 3000), log_beta(-1.5, 1), unit(0, 1);
  std::uniform_int_distribution<int> n_rails(2, 4);
  std::uniform_int_distribution<size_t> payload(kLatencyBoundBytes / 4 + 1, kMidBandMaxBytes / 4);
  int striped = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    std::vector<RailEstimate> rails;
    const int n = n_rails(rng);
    for (int i = 0; i < n; ++i) {
      rails.push_back(with_mid(alpha(rng), std::pow(10.0, log_beta(rng)), alpha(rng), std::pow(10.0, log_beta(rng))));
      rails.back().bulk_alpha_us = alpha(rng);
      if (i > 0 && unit(rng) < 0.3) rails.back().mid_alpha_us = rails.back().mid_beta_gbps = 0;  // not measured there
    }
    const PlanRequest req{payload(rng), 4, rails, std::vector<bool>(n, true), 64};
    const Plan plan = plan_split(req);
    size_t total = 0;
    double finish = 0;
    for (const RailShare& s : plan.shares) {
      total += s.count;
      finish = std::max(finish, share_seconds(rails[s.rail], double(s.count) * 4));
    }
    ASSERT_EQ(total, req.count);
    double best = INFINITY;
    for (const RailEstimate& e : rails) best = std::min(best, share_seconds(e, double(req.count) * 4));
    if (plan.striped) {
      ++striped;
      // Rounding to 64-byte units moves each share by less than a unit's time on the slowest rail;
      // a share rounded across kLatencyBoundBytes changes price, by at most its start-ups' gap.
      EXPECT_LE(finish, (1 - kMinStripingGain) * best + 1e-6) << plan.why;
    } else {
      EXPECT_NEAR(finish, best, 1e-12) << plan.why;
    }
  }
  EXPECT_GT(striped, 100);
}

// 16 ranks: a 4 KB log-step takes `small_s`, halving/doubling mid_alpha_s + bytes at mid_gbps, the
// ring 2.5 ms + bytes at 0.514 Gbit/s.
struct SixteenRanks {
  double small_s, mid_alpha_s, mid_gbps;
  double seconds(size_t bytes) const {
    if (bytes <= kLatencyBoundBytes) return small_s;
    if (bytes <= kMidBandMaxBytes) return mid_alpha_s + bytes * 8 / (mid_gbps * 1e9);
    return 2.5e-3 + bytes * 8 / 0.514e9;
  }
};

SplitRegimeModel calibrated(const SixteenRanks& link) {
  SplitRegimeModel m;
  for (size_t b : RailTable::calibration_bytes()) m.observe(b, link.seconds(b));
  return m;
}

TEST(SplitRegimeModelMidBand, CalibrationLeavesTheBandToTraffic) {
  const SixteenRanks link{2e-3, 1.5e-3, 0.83};
  SplitRegimeModel m = calibrated(link);
  RailEstimate e = m.estimate();
  ASSERT_TRUE(e.known());
  EXPECT_FALSE(e.mid_known());
  EXPECT_EQ(e.mid_alpha_us, 0);
  for (int i = 0; i < 3; ++i) m.observe(256 << 10, link.seconds(256 << 10));
  e = m.estimate();
  ASSERT_TRUE(e.mid_known());
  // Mid-band samples alone make no estimate: the large payloads' fit is what makes a rail known.
  SplitRegimeModel mid_only;
  for (int i = 0; i < 5; ++i) mid_only.observe(128 << 10, 2.8e-3);
  EXPECT_FALSE(mid_only.estimate().known());
  EXPECT_EQ(mid_only.estimate().samples, 5u);
}

TEST(SplitRegimeModelMidBand, OneSizeOfTrafficFitsTheRateFromTheSmallPayloadsStartUp) {
  // 256 KB calls only: the start-up is the small payloads' 2 ms, the rate what makes 256 KB right.
  const SixteenRanks link{2e-3, 1.5e-3, 0.83};
  SplitRegimeModel m = calibrated(link);
  for (int i = 0; i < 50; ++i) m.observe(256 << 10, link.seconds(256 << 10));
  RailEstimate e = m.estimate();
  ASSERT_TRUE(e.mid_known());
  EXPECT_NEAR(e.mid_alpha_us, 2000, 1e-6);
  EXPECT_NEAR(e.mid_alpha_us * 1e-6 + (256 << 10) * 8 / (e.mid_beta_gbps * 1e9), link.seconds(256 << 10), 1e-9);
  // The start-up follows the small payloads' time.
  for (int i = 0; i < 30; ++i) m.observe(4096, 1e-3);
  m.observe(256 << 10, link.seconds(256 << 10));
  e = m.estimate();
  EXPECT_NEAR(e.mid_alpha_us, 1000, 5);  // the small payloads' EWMA, 0.8^30 of the way from 2 ms
  EXPECT_NEAR(e.mid_alpha_us * 1e-6 + (256 << 10) * 8 / (e.mid_beta_gbps * 1e9), link.seconds(256 << 10), 0.1e-3);
}

TEST(SplitRegimeModelMidBand, AStartUpAboveTheBandsTimesFitsThroughTheOrigin) {
  // The small payloads' time (a stalled log-step, 5 ms) exceeds the band's 2.8 ms: rate only.
  const SixteenRanks link{5e-3, 1.5e-3, 0.83};
  SplitRegimeModel m = calibrated(link);
  for (int i = 0; i < 10; ++i) m.observe(128 << 10, link.seconds(128 << 10));
  const RailEstimate e = m.estimate();
  ASSERT_TRUE(e.mid_known());
  EXPECT_EQ(e.mid_alpha_us, 0);
  EXPECT_NEAR((128 << 10) * 8 / (e.mid_beta_gbps * 1e9), link.seconds(128 << 10), 1e-9);
}

TEST(SplitRegimeModelMidBand, ARateThatDropsIsFollowedWithinAFewCalls) {
  // A rested token bucket passes the first calls at the burst rate, then the provisioned one.
  const SixteenRanks burst{2e-3, 1.5e-3, 5}, steady{2e-3, 1.5e-3, 0.83};
  SplitRegimeModel m = calibrated(steady);
  for (int i = 0; i < 10; ++i) m.observe(256 << 10, burst.seconds(256 << 10));
  for (int i = 0; i < 5; ++i) m.observe(256 << 10, steady.seconds(256 << 10));
  const RailEstimate e = m.estimate();
  const double predicted = e.mid_alpha_us * 1e-6 + (256 << 10) * 8 / (e.mid_beta_gbps * 1e9);
  EXPECT_NEAR(predicted / steady.seconds(256 << 10), 1, 0.1);
}

}  // namespace
}  // namespace nezha::multirail
