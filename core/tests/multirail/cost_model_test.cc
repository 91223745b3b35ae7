#include "multirail/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/error.h"

namespace nezha::multirail {
namespace {

// A simulated rail: time = alpha + bytes / beta, times (1 + relative Gaussian noise).
struct FakeRail {
  double alpha_us;
  double beta_gbps;
  double noise;
  std::mt19937_64 rng;

  FakeRail(double a, double b, double n, uint64_t seed) : alpha_us(a), beta_gbps(b), noise(n), rng(seed) {}

  double exact_seconds(size_t bytes) const { return alpha_us * 1e-6 + bytes * 8.0 / (beta_gbps * 1e9); }
  double seconds(size_t bytes) {
    std::normal_distribution<double> n(0, noise);
    return exact_seconds(bytes) * std::max(0.5, 1 + n(rng));
  }
  // Sizes as an engine sees them: log-uniform from 256 B to 16 MB.
  size_t mixed_size() {
    std::uniform_real_distribution<double> e(8, 24);
    return static_cast<size_t>(std::exp2(e(rng)));
  }
  size_t large_size() {
    std::uniform_int_distribution<size_t> d(4 << 20, 16 << 20);
    return d(rng);
  }
};

void feed_mixed(RailCostModel& m, FakeRail& r, int n) {
  for (int i = 0; i < n; ++i) {
    size_t b = r.mixed_size();
    m.observe(b, r.seconds(b));
  }
}

void feed_large(RailCostModel& m, FakeRail& r, int n) {
  for (int i = 0; i < n; ++i) {
    size_t b = r.large_size();
    m.observe(b, r.seconds(b));
  }
}

TEST(RailCostModel, UnknownUntilEnoughSamples) {
  RailCostModel m;
  EXPECT_FALSE(m.estimate().known());
  EXPECT_THROW(m.predict_seconds(1000), InvalidArgument);
  m.observe(1000, 60e-6);
  m.observe(1 << 20, 8.4e-3);
  EXPECT_FALSE(m.estimate().known());
  EXPECT_EQ(m.estimate().samples, 2u);
  m.observe(4 << 20, 33.6e-3);
  EXPECT_TRUE(m.estimate().known());
  EXPECT_EQ(m.estimate().samples, 3u);
}

TEST(RailCostModel, RecoversAlphaAndBetaFromNoisySamples) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FakeRail rail(50, 1.0, 0.05, seed);
    RailCostModel m;
    feed_mixed(m, rail, 300);
    RailEstimate e = m.estimate();
    ASSERT_TRUE(e.known());
    EXPECT_NEAR(e.alpha_us, 50, 50 * 0.05);
    EXPECT_NEAR(e.beta_gbps, 1.0, 0.03);
    EXPECT_NEAR(m.predict_seconds(8 << 20), rail.exact_seconds(8 << 20),
                0.03 * rail.exact_seconds(8 << 20));
  }
}

TEST(RailCostModel, NoiselessSamplesGiveExactParameters) {
  FakeRail rail(120, 10.0, 0.0, 7);
  RailCostModel m;
  feed_mixed(m, rail, 50);
  EXPECT_NEAR(m.estimate().alpha_us, 120, 1e-3);
  EXPECT_NEAR(m.estimate().beta_gbps, 10.0, 1e-5);
}

TEST(RailCostModel, OneSizeOnlyStillPredictsThatSize) {
  FakeRail rail(50, 1.0, 0.05, 3);
  RailCostModel m;
  const size_t bytes = 8 << 20;
  for (int i = 0; i < 100; ++i) m.observe(bytes, rail.seconds(bytes));
  ASSERT_TRUE(m.estimate().known());
  EXPECT_GE(m.estimate().alpha_us, 0);
  EXPECT_NEAR(m.predict_seconds(bytes), rail.exact_seconds(bytes), 0.03 * rail.exact_seconds(bytes));
}

TEST(RailCostModel, KeepsAlphaWhenTrafficNarrowsToLargeMessages) {
  FakeRail rail(50, 1.0, 0.05, 4);
  RailCostModel m;
  feed_mixed(m, rail, 300);
  // Long stretch of large-only traffic: the small samples decay away, alpha must not drift.
  feed_large(m, rail, 400);
  EXPECT_NEAR(m.estimate().alpha_us, 50, 50 * 0.1);
  EXPECT_NEAR(m.estimate().beta_gbps, 1.0, 0.03);
}

TEST(RailCostModel, FollowsStepChangeInBetaWithinFiveLargeSamples) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FakeRail rail(50, 1.0, 0.05, seed);
    RailCostModel m;
    feed_mixed(m, rail, 200);
    ASSERT_NEAR(m.estimate().beta_gbps, 1.0, 0.03);

    rail.beta_gbps = 0.25;  // tc cut the rail to 250 Mbit/s
    feed_large(m, rail, 5);
    EXPECT_NEAR(m.estimate().beta_gbps, 0.25, 0.25 * 0.1);
    EXPECT_NEAR(m.estimate().alpha_us, 50, 50 * 0.1);  // the change was in beta only

    rail.beta_gbps = 1.0;  // and back
    feed_large(m, rail, 5);
    EXPECT_NEAR(m.estimate().beta_gbps, 1.0, 0.1);
  }
}

TEST(RailCostModel, FollowsModerateChangeInBeta) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FakeRail rail(50, 1.0, 0.05, seed);
    RailCostModel m;
    feed_mixed(m, rail, 200);
    rail.beta_gbps = 0.7;
    feed_large(m, rail, 5);
    EXPECT_NEAR(m.estimate().beta_gbps, 0.7, 0.7 * 0.1);
  }
}

TEST(RailCostModel, StaysSteadyOnAStationaryRail) {
  // Noise alone must not be taken for a change (which would restart the fit from a few samples).
  FakeRail rail(50, 1.0, 0.05, 21);
  RailCostModel m;
  feed_mixed(m, rail, 200);
  for (int i = 0; i < 2000; ++i) {
    feed_mixed(m, rail, 1);
    ASSERT_NEAR(m.estimate().beta_gbps, 1.0, 0.05) << "after " << i << " more samples";
    ASSERT_NEAR(m.estimate().alpha_us, 50, 50 * 0.15) << "after " << i << " more samples";
  }
}

TEST(RailCostModel, FollowsChangeInBetaWhileSmallMessagesInterleave) {
  FakeRail rail(50, 1.0, 0.05, 12);
  RailCostModel m;
  feed_mixed(m, rail, 200);
  rail.beta_gbps = 0.25;
  // Latency-bound messages between the large ones neither confirm nor break the change.
  for (int i = 0; i < 5; ++i) {
    size_t big = rail.large_size();
    m.observe(big, rail.seconds(big));
    m.observe(512, rail.seconds(512));
  }
  EXPECT_NEAR(m.estimate().beta_gbps, 0.25, 0.25 * 0.1);
}

TEST(RailCostModel, FollowsChangeInAlphaFromSmallMessages) {
  FakeRail rail(50, 1.0, 0.05, 13);
  RailCostModel m;
  feed_mixed(m, rail, 200);
  rail.alpha_us = 550;  // netem added 500 us of delay
  for (int i = 0; i < 5; ++i) m.observe(1024, rail.seconds(1024));
  EXPECT_NEAR(m.estimate().alpha_us, 550, 550 * 0.1);
  EXPECT_NEAR(m.estimate().beta_gbps, 1.0, 0.1);
}

TEST(RailCostModel, IgnoresASingleOutlier) {
  for (double factor : {10.0, 0.1, 2.0}) {
    SCOPED_TRACE("outlier factor " + std::to_string(factor));
    FakeRail rail(50, 1.0, 0.05, 5);
    RailCostModel m;
    feed_mixed(m, rail, 300);
    const RailEstimate before = m.estimate();
    const size_t bytes = 8 << 20;
    m.observe(bytes, rail.exact_seconds(bytes) * factor);
    const RailEstimate after = m.estimate();
    EXPECT_NEAR(after.beta_gbps, before.beta_gbps, before.beta_gbps * 0.01);
    EXPECT_NEAR(after.alpha_us, before.alpha_us, before.alpha_us * 0.02);
    // ... and the next ordinary samples are not taken for a change either.
    feed_large(m, rail, 3);
    EXPECT_NEAR(m.estimate().beta_gbps, 1.0, 0.03);
  }
}

TEST(RailCostModel, RobustToSparseStalls) {
  FakeRail rail(50, 1.0, 0.05, 6);
  RailCostModel m;
  for (int i = 0; i < 500; ++i) {
    size_t b = rail.mixed_size();
    double t = rail.seconds(b);
    if (i % 10 == 9) t *= 5;  // every tenth operation hits a stall
    m.observe(b, t);
  }
  EXPECT_NEAR(m.estimate().beta_gbps, 1.0, 0.05);
  EXPECT_NEAR(m.estimate().alpha_us, 50, 50 * 0.1);
}

TEST(RailCostModel, ResetForgetsEverything) {
  FakeRail rail(50, 1.0, 0.05, 8);
  RailCostModel m;
  feed_mixed(m, rail, 50);
  ASSERT_TRUE(m.estimate().known());
  m.reset();
  EXPECT_FALSE(m.estimate().known());
  EXPECT_EQ(m.estimate().samples, 0u);
  FakeRail other(10, 5.0, 0.0, 9);
  feed_mixed(m, other, 20);
  EXPECT_NEAR(m.estimate().beta_gbps, 5.0, 1e-3);
  EXPECT_NEAR(m.estimate().alpha_us, 10, 1e-2);
}

TEST(RailCostModel, RejectsInvalidTimes) {
  RailCostModel m;
  EXPECT_THROW(m.observe(100, -1e-6), InvalidArgument);
  EXPECT_THROW(m.observe(100, std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
  EXPECT_THROW(m.observe(100, std::numeric_limits<double>::infinity()), InvalidArgument);
  EXPECT_EQ(m.estimate().samples, 0u);
  m.observe(0, 0.0);  // below clock resolution: accepted
  EXPECT_EQ(m.estimate().samples, 1u);
}

TEST(RailCostModel, RejectsInvalidOptions) {
  RailCostModelOptions bad;
  bad.half_life_samples = 0;
  EXPECT_THROW(RailCostModel{bad}, InvalidArgument);
  bad = {};
  bad.outlier_ratio = 1.0;
  EXPECT_THROW(RailCostModel{bad}, InvalidArgument);
}

TEST(RailEstimate, KnownNeedsSamplesAndPositiveBeta) {
  EXPECT_FALSE(RailEstimate{}.known());
  EXPECT_FALSE((RailEstimate{10, 0, 5}.known()));
  EXPECT_FALSE((RailEstimate{10, 1, 0}.known()));
  EXPECT_FALSE((RailEstimate{-1, 1, 5}.known()));
  EXPECT_FALSE((RailEstimate{std::numeric_limits<double>::quiet_NaN(), 1, 5}.known()));
  EXPECT_TRUE((RailEstimate{0, 1, 1}.known()));
}

}  // namespace
}  // namespace nezha::multirail
