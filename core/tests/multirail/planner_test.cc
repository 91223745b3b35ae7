#include "multirail/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>

#include "common/error.h"

namespace nezha::multirail {
namespace {

RailEstimate est(double alpha_us, double beta_gbps) { return RailEstimate{alpha_us, beta_gbps, 100}; }
RailEstimate unknown() { return RailEstimate{}; }

// What a share that moves bandwidth pays before its bytes flow (planner.h: Prices).
double bulk_start_s(const RailEstimate& e) { return std::max(e.alpha_us, e.bulk_alpha_us) * 1e-6; }

double seconds_on(const RailEstimate& e, double bytes) {
  const double start = bytes < double(kLatencyBoundBytes) ? e.alpha_us * 1e-6 : bulk_start_s(e);
  return start + bytes * 8 / (e.beta_gbps * 1e9);
}

// Independent reference for the common finish time: bisection on T of sum max(0, (T - a) b) = bytes.
double reference_level(const std::vector<RailEstimate>& rails, const std::vector<bool>& usable,
                       double bytes) {
  auto carried = [&](double t) {
    double sum = 0;
    for (size_t i = 0; i < rails.size(); ++i)
      if (usable[i]) sum += std::max(0.0, (t - bulk_start_s(rails[i])) * rails[i].beta_gbps * 1e9 / 8);
    return sum;
  };
  double lo = 0, hi = 1;
  while (carried(hi) < bytes) hi *= 2;
  for (int i = 0; i < 200; ++i) {
    double mid = (lo + hi) / 2;
    (carried(mid) < bytes ? lo : hi) = mid;
  }
  return hi;
}

double reference_single(const std::vector<RailEstimate>& rails, const std::vector<bool>& usable,
                        double bytes) {
  double best = INFINITY;
  for (size_t i = 0; i < rails.size(); ++i)
    if (usable[i]) best = std::min(best, seconds_on(rails[i], bytes));
  return best;
}

bool reference_stripes(const std::vector<RailEstimate>& rails, const std::vector<bool>& usable,
                       double bytes) {
  return reference_level(rails, usable, bytes) <=
         (1 - kMinStripingGain) * reference_single(rails, usable, bytes);
}

// Shares are contiguous from 0, in rail order, non-empty, on usable rails, and sum to count.
void expect_well_formed(const PlanRequest& req, const Plan& plan) {
  size_t offset = 0;
  int last_rail = -1;
  for (const RailShare& s : plan.shares) {
    EXPECT_GT(s.rail, last_rail);
    ASSERT_LT(static_cast<size_t>(s.rail), req.rails.size());
    EXPECT_TRUE(req.usable[s.rail]) << "rail " << s.rail;
    EXPECT_EQ(s.offset, offset);
    EXPECT_GT(s.count, 0u);
    EXPECT_EQ(s.offset * req.elem_size % std::lcm(req.elem_size, req.align_bytes), 0u)
        << "share on rail " << s.rail << " starts unaligned";
    offset += s.count;
    last_rail = s.rail;
  }
  EXPECT_EQ(offset, req.count);
  EXPECT_EQ(plan.striped, plan.shares.size() > 1);
}

TEST(PlanSplit, EqualRailsGetEqualShares) {
  PlanRequest req{16 << 20, 4, {est(50, 1), est(50, 1)}, {true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 2u);
  EXPECT_TRUE(plan.striped);
  EXPECT_NEAR(double(plan.shares[0].count), double(req.count) / 2, 16.0);
  EXPECT_NEAR(double(plan.shares[1].count), double(req.count) / 2, 16.0);
}

TEST(PlanSplit, FastAndSlowRailSplitByBandwidthAndFinishTogether) {
  std::vector<RailEstimate> rails{est(50, 1.0), est(50, 0.25)};
  PlanRequest req{16 << 20, 4, rails, {true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 2u);
  EXPECT_NEAR(double(plan.shares[0].count) / req.count, 0.8, 0.001);
  EXPECT_NEAR(double(plan.shares[1].count) / req.count, 0.2, 0.001);
  const double t0 = seconds_on(rails[0], plan.shares[0].count * 4.0);
  const double t1 = seconds_on(rails[1], plan.shares[1].count * 4.0);
  EXPECT_NEAR(t0, t1, 1e-4 * t0);
  EXPECT_NEAR(t0, reference_level(rails, req.usable, req.count * 4.0), 1e-4 * t0);
}

TEST(PlanSplit, RoundingLeftoversGoToFastestRailAndTailToLastShare) {
  // 16-element (64-byte) units; count leaves a 3-element tail.
  for (bool fastest_first : {false, true}) {
    SCOPED_TRACE(fastest_first ? "fastest rail first" : "fastest rail last");
    std::vector<RailEstimate> rails{est(50, fastest_first ? 3 : 1), est(50, fastest_first ? 1 : 3)};
    const int slow = fastest_first ? 1 : 0, fast = 1 - slow;
    PlanRequest req{62503 * 16 + 3, 4, rails, {true, true}};  // quarter shares leave a unit over
    Plan plan = plan_split(req);
    expect_well_formed(req, plan);
    ASSERT_EQ(plan.shares.size(), 2u);
    const double level = reference_level(rails, req.usable, req.count * 4.0);
    const double slow_bytes = (level - 50e-6) * rails[slow].beta_gbps * 1e9 / 8;
    const size_t slow_units = static_cast<size_t>(std::floor(slow_bytes / 64));
    const size_t tail = fastest_first ? 3 : 0;  // the tail rides on the last share (rail 1)
    EXPECT_EQ(plan.shares[slow].count, slow_units * 16 + tail);
    EXPECT_EQ(plan.shares[fast].count, req.count - slow_units * 16 - tail);
  }
}

TEST(PlanSplit, RailWhoseAlphaExceedsTheFinishTimeGetsNothing) {
  // 1 MB over two 10 Gbit/s rails finishes in ~0.47 ms; a rail with 5 ms start-up cost cannot help.
  std::vector<RailEstimate> rails{est(50, 10), est(50, 10), est(5000, 100)};
  PlanRequest req{1 << 20, 1, rails, {true, true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 2u);
  EXPECT_EQ(plan.shares[0].rail, 0);
  EXPECT_EQ(plan.shares[1].rail, 1);
}

TEST(PlanSplit, LatencyBoundPayloadGoesWholeOnLowestAlphaRail) {
  PlanRequest req{64, 4, {est(50, 1), est(30, 1)}, {true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 1u);
  EXPECT_EQ(plan.shares[0].rail, 1);
  EXPECT_FALSE(plan.striped);
  EXPECT_NE(plan.why.find("cold"), std::string::npos) << plan.why;
}

TEST(PlanSplit, UnstripedPayloadGoesOnTheRailPredictedToFinishFirst) {
  // The slow rail has the lower alpha, but 1 MB is bandwidth-bound: it must not get the payload.
  // (Seen on the testbed: a 250 Mbit/s rail with alpha 200 us beside a 10 Gbit/s one with 400 us.)
  std::vector<RailEstimate> rails{est(426, 9.75), est(208, 0.15)};
  PlanRequest req{1 << 20, 4, rails, {true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 1u) << plan.why;
  EXPECT_EQ(plan.shares[0].rail, 0) << plan.why;
}

TEST(PlanSplit, UnusableRailGetsNoShare) {
  PlanRequest req{16 << 20, 4, {est(50, 1), est(50, 1), est(50, 1)}, {true, false, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 2u);
  EXPECT_EQ(plan.shares[0].rail, 0);
  EXPECT_EQ(plan.shares[1].rail, 2);
}

TEST(PlanSplit, UnknownRailMakesItColdOnLowestAlphaKnownRail) {
  PlanRequest req{16 << 20, 4, {unknown(), est(30, 1), est(20, 1)}, {true, true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 1u);
  EXPECT_EQ(plan.shares[0].rail, 2);
  EXPECT_NE(plan.why.find("cold"), std::string::npos) << plan.why;
}

TEST(PlanSplit, NothingKnownGoesOnLowestIndexUsableRail) {
  PlanRequest req{16 << 20, 4, {unknown(), unknown(), unknown()}, {false, true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 1u);
  EXPECT_EQ(plan.shares[0].rail, 1);
}

TEST(PlanSplit, UnknownButUnusableRailDoesNotBlockStriping) {
  PlanRequest req{16 << 20, 4, {est(50, 1), unknown(), est(50, 1)}, {true, false, true}};
  EXPECT_TRUE(plan_split(req).striped);
}

TEST(PlanSplit, EmptyPayloadGivesEmptyPlan) {
  Plan plan = plan_split(PlanRequest{0, 4, {est(50, 1)}, {true}});
  EXPECT_TRUE(plan.shares.empty());
  EXPECT_FALSE(plan.striped);
}

TEST(PlanSplit, RejectsBadRequests) {
  EXPECT_THROW(plan_split(PlanRequest{10, 4, {est(50, 1)}, {false}}), NezhaError);
  EXPECT_THROW(plan_split(PlanRequest{10, 4, {}, {}}), NezhaError);
  EXPECT_THROW(plan_split(PlanRequest{10, 0, {est(50, 1)}, {true}}), InvalidArgument);
  EXPECT_THROW(plan_split(PlanRequest{10, 4, {est(50, 1)}, {true}, 0}), InvalidArgument);
  EXPECT_THROW(plan_split(PlanRequest{10, 4, {est(50, 1)}, {true, true}}), InvalidArgument);
  EXPECT_THROW(plan_split(PlanRequest{SIZE_MAX / 2, 4, {est(50, 1)}, {true}}), InvalidArgument);
}

TEST(StripingThreshold, NeverWithFewerThanTwoKnownUsableRails) {
  EXPECT_EQ(striping_threshold_bytes({est(50, 1)}, {true}), SIZE_MAX);
  EXPECT_EQ(striping_threshold_bytes({est(50, 1), est(50, 1)}, {true, false}), SIZE_MAX);
  EXPECT_EQ(striping_threshold_bytes({est(50, 1), unknown()}, {true, true}), SIZE_MAX);
}

TEST(StripingThreshold, NeverWhenTheOtherRailAddsTooLittle) {
  // 1 Gbit/s + 10 Mbit/s: at most 1% faster than the fast rail alone, below kMinStripingGain.
  EXPECT_EQ(striping_threshold_bytes({est(50, 1), est(50, 0.01)}, {true, true}), SIZE_MAX);
}

TEST(StripingThreshold, EqualRailsWorkedExample) {
  // Two rails alpha a, rate b: striping time a + P/2b <= 0.95 (a + P/b)  <=>  P >= 0.05 a b / 0.45.
  const double a = 50e-6, b = 1e9 / 8;
  const double expected = kMinStripingGain * a * b / (1 - kMinStripingGain - 0.5);
  EXPECT_NEAR(double(striping_threshold_bytes({est(50, 1), est(50, 1)}, {true, true})), expected, 1.0);
}

// Random rails; with `bulk`, each also has a bulk start-up of up to 20x its latency (a ring at scale)
// or below it (a token bucket's burst).
void expect_threshold_matches_brute_force(uint64_t seed, bool bulk) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> alpha(0, 500), log_beta(-2, 2), bulk_factor(0, 20);
  std::uniform_int_distribution<int> n_rails(2, 5);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<RailEstimate> rails;
    int n = n_rails(rng);
    for (int i = 0; i < n; ++i) {
      rails.push_back(est(alpha(rng), std::pow(10.0, log_beta(rng))));
      if (bulk) rails.back().bulk_alpha_us = rails.back().alpha_us * bulk_factor(rng);
    }
    std::vector<bool> usable(n, true);
    const size_t threshold = striping_threshold_bytes(rails, usable);
    SCOPED_TRACE("iteration " + std::to_string(iter));
    if (threshold == SIZE_MAX) {
      EXPECT_FALSE(reference_stripes(rails, usable, 1e15));
      continue;
    }
    const double t = double(threshold);
    EXPECT_TRUE(reference_stripes(rails, usable, t * (1 + 1e-9) + 1));
    if (threshold > 0) EXPECT_FALSE(reference_stripes(rails, usable, t * (1 - 1e-6) - 1));
    // No smaller payload stripes either (log-spaced scan below the threshold).
    for (double p = 1; p < t * (1 - 1e-6) - 1; p *= 1.1) {
      ASSERT_FALSE(reference_stripes(rails, usable, p)) << "stripes already at " << p << " B";
    }
  }
}

TEST(StripingThreshold, MatchesBruteForceReference) { expect_threshold_matches_brute_force(42, false); }

TEST(StripingThreshold, MatchesBruteForceReferenceWithBulkStartUps) {
  expect_threshold_matches_brute_force(43, true);
}

TEST(AmortizedRange, KeepsTheBulkStartUpAnEighthOfARange) {
  RailEstimate rdma = est(40, 100);
  EXPECT_EQ(amortized_range_bytes(rdma), 0u);  // no bulk start-up measured: no minimum
  rdma.bulk_alpha_us = 1270;  // a ring over 128 ranks
  const double range = double(amortized_range_bytes(rdma));
  // start-up / (start-up + range / rate) = 1 / (1 + kRangeAmortization)
  const double rate = 100e9 / 8, start = 1270e-6;
  EXPECT_NEAR(start / (start + range / rate), 1 / (1 + kRangeAmortization), 1e-9);
  EXPECT_EQ(amortized_range_bytes(unknown()), 0u);
}

TEST(PlanSplit, BandwidthBoundSharesPayTheBulkStartUp) {
  // 32 ranks: RDMA 100 Gbit/s and TCP 25 Gbit/s, both ~40 us for a log-step payload, but a ring
  // share pays 62 steps first (RDMA 0.6 ms, TCP 1.9 ms). 1 MB on RDMA alone takes ~0.68 ms: a TCP
  // share could only finish after 1.9 ms, so it gets none. Priced with the latency alone the plan
  // would have put ~20% of the payload on TCP.
  std::vector<RailEstimate> rails{est(40, 100), est(45, 25)};
  rails[0].bulk_alpha_us = 600;
  rails[1].bulk_alpha_us = 1900;
  PlanRequest req{1 << 18, 4, rails, {true, true}};
  Plan plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 1u) << plan.why;
  EXPECT_EQ(plan.shares[0].rail, 0) << plan.why;
  // 64 MB is worth striping even so: both rails finish together after their bulk start-ups.
  req.count = 16 << 20;
  plan = plan_split(req);
  expect_well_formed(req, plan);
  ASSERT_EQ(plan.shares.size(), 2u) << plan.why;
  const double level = reference_level(rails, req.usable, double(64 << 20));
  for (const RailShare& sh : plan.shares)
    EXPECT_NEAR(seconds_on(rails[sh.rail], double(sh.count) * 4), level, 2e-6) << "rail " << sh.rail;
  // A latency-bound payload still goes on the lowest latency, whatever the bulk start-ups.
  rails[1].alpha_us = 30;
  req = PlanRequest{256, 4, rails, {true, true}};
  plan = plan_split(req);
  ASSERT_EQ(plan.shares.size(), 1u) << plan.why;
  EXPECT_EQ(plan.shares[0].rail, 1) << plan.why;
}

TEST(PlanSplit, PropertiesHoldOverRandomRequests) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0, 1);
  const size_t elem_sizes[] = {1, 2, 4, 8, 12};
  const size_t aligns[] = {1, 64, 4096};
  int striped_plans = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    PlanRequest req;
    const int n = 1 + int(unit(rng) * 6);
    for (int i = 0; i < n; ++i) {
      req.rails.push_back(unit(rng) < 0.05 ? unknown()
                                           : est(unit(rng) * 500, std::pow(10.0, unit(rng) * 4 - 2)));
      req.usable.push_back(unit(rng) < 0.85);
    }
    req.usable[int(unit(rng) * n)] = true;
    req.elem_size = elem_sizes[int(unit(rng) * 5)];
    req.align_bytes = aligns[int(unit(rng) * 3)];
    req.count = size_t(std::pow(10.0, unit(rng) * 9)) - 1;
    SCOPED_TRACE("iteration " + std::to_string(iter));

    const Plan plan = plan_split(req);
    expect_well_formed(req, plan);
    const Plan again = plan_split(req);
    ASSERT_EQ(again.shares.size(), plan.shares.size());
    for (size_t i = 0; i < plan.shares.size(); ++i) {
      EXPECT_EQ(again.shares[i].rail, plan.shares[i].rail);
      EXPECT_EQ(again.shares[i].count, plan.shares[i].count);
    }
    if (!plan.striped) continue;
    ++striped_plans;

    // Every rail finishes by the common time, give or take the rounding each share may carry: a few
    // alignment units for the fastest rail, one unit plus the sub-unit tail for the others.
    const double bytes = double(req.count) * req.elem_size;
    const double level = reference_level(req.rails, req.usable, bytes);
    const double unit_bytes = double(std::lcm(req.elem_size, req.align_bytes));
    for (const RailShare& s : plan.shares) {
      const RailEstimate& e = req.rails[s.rail];
      const double slack = (n + 1) * unit_bytes * 8 / (e.beta_gbps * 1e9);
      EXPECT_LE(seconds_on(e, double(s.count) * req.elem_size), level * (1 + 1e-9) + slack)
          << "rail " << s.rail;
    }
  }
  EXPECT_GT(striped_plans, 300);  // the loop really exercised the hot path
}

}  // namespace
}  // namespace nezha::multirail
