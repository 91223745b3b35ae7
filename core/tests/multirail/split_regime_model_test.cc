#include "multirail/split_regime_model.h"

#include <gtest/gtest.h>

namespace nezha::multirail {
namespace {

// A token-bucket link: payloads up to the burst pass at 10 Gbit/s, longer ones at 1 Gbit/s.
double shaped_seconds(size_t bytes) {
  const double alpha = 200e-6, burst = 256 << 10;
  if (bytes <= burst) return alpha + bytes * 8 / 10e9;
  return alpha + burst * 8 / 10e9 + (bytes - burst) * 8 / 1e9;
}

TEST(SplitRegimeModel, ManySmallSamplesDoNotInflateTheBandwidthOfLargeOnes) {
  SplitRegimeModel m;
  for (size_t b : {size_t{1} << 20, size_t{2} << 20, size_t{1} << 20}) m.observe(b, shaped_seconds(b));
  for (int i = 0; i < 500; ++i) m.observe(64 + (i % 3) * 1000, shaped_seconds(64 + (i % 3) * 1000));
  for (int i = 0; i < 200; ++i) m.observe(200 << 10, shaped_seconds(200 << 10));  // burst-sized
  RailEstimate e = m.estimate();
  ASSERT_TRUE(e.known());
  // Near the sustained rate (a through-origin fit at 1-2 MB includes the burst's head start),
  // nowhere near the 10 Gbit/s burst rate.
  EXPECT_GT(e.beta_gbps, 0.8);
  EXPECT_LT(e.beta_gbps, 1.3);
  EXPECT_NEAR(e.alpha_us, 200, 20);     // what a tiny payload actually costs
}

TEST(SplitRegimeModel, BulkStartUpIsTheLargePayloadsInterceptNotTheLatency) {
  // A ring over 32 ranks of 100 Gbit/s links: a 4 KB log-step costs 60 us, a bandwidth-bound ring
  // pays 62 steps of 25 us (1.55 ms) before moving 2(n-1)/n of its bytes. The calibration's payloads
  // (RailTable::calibration_bytes) are enough to tell the two apart.
  auto ring_seconds = [](size_t bytes) { return 1.55e-3 + 2.0 * 31 / 32 * bytes * 8 / 100e9; };
  SplitRegimeModel m;
  for (int i = 0; i < 3; ++i) m.observe(4096, 60e-6);
  for (size_t b : {size_t{512} << 10, size_t{1} << 20, size_t{2} << 20}) m.observe(b, ring_seconds(b));
  const RailEstimate e = m.estimate();
  ASSERT_TRUE(e.known());
  EXPECT_NEAR(e.alpha_us, 60, 1);
  EXPECT_NEAR(e.bulk_alpha_us, 1550, 30);
  EXPECT_NEAR(e.beta_gbps, 100 * 32 / 62.0, 1);
}

TEST(SplitRegimeModel, BulkStartUpStaysZeroWhileTheLargePayloadsCannotSeparateIt) {
  // 4 ranks of 1 Gbit/s: 120 us of ring steps are lost in 1-2 MB transfers of 10-30 ms (timing
  // noise is assumed at 10% until measured), so the fit keeps alpha = 0 and the effective rate.
  auto ring_seconds = [](size_t bytes) { return 120e-6 + 1.5 * bytes * 8 / 1e9; };
  SplitRegimeModel m;
  for (int i = 0; i < 3; ++i) m.observe(4096, 80e-6);
  for (size_t b : {size_t{512} << 10, size_t{1} << 20, size_t{2} << 20}) m.observe(b, ring_seconds(b));
  const RailEstimate e = m.estimate();
  ASSERT_TRUE(e.known());
  EXPECT_EQ(e.bulk_alpha_us, 0);
  EXPECT_NEAR(e.alpha_us, 80, 1);
  EXPECT_NEAR(e.beta_gbps, 1 / 1.5, 0.02);
}

TEST(SplitRegimeModel, OneStalledCalibrationSampleDoesNotSetTheStartUp) {
  // Calibration's three 4 KB exchanges on a loaded host: one waited 30 ms for a descheduled peer.
  // As the EWMA's start (the first one stalled) it priced the rail's start-up at 19 ms, more than a
  // 6 MB share takes on loopback: the rail would carry nothing in any striped plan.
  for (int stalled = 0; stalled < 3; ++stalled) {
    SplitRegimeModel m;
    for (int i = 0; i < 3; ++i) m.observe(4096, i == stalled ? 30e-3 : 80e-6 + i * 5e-6);
    for (size_t b : {size_t{512} << 10, size_t{1} << 20, size_t{2} << 20}) m.observe(b, 100e-6 + b * 8 / 10e9);
    EXPECT_NEAR(m.estimate().alpha_us, stalled == 2 ? 85 : 90, 1e-6) << "stalled " << stalled;
  }
  // After the seeds the EWMA follows every sample as before.
  SplitRegimeModel m;
  for (int i = 0; i < 3; ++i) m.observe(4096, 80e-6);
  m.observe(4096, 180e-6);
  for (size_t b : {size_t{512} << 10, size_t{1} << 20, size_t{2} << 20}) m.observe(b, 100e-6 + b * 8 / 10e9);
  EXPECT_NEAR(m.estimate().alpha_us, 100, 1e-6);
}

TEST(SplitRegimeModel, UnknownUntilLargePayloadsWereSeen) {
  SplitRegimeModel m;
  for (int i = 0; i < 10; ++i) m.observe(4096, 100e-6);
  EXPECT_FALSE(m.estimate().known());
  m.observe(1 << 20, 8.5e-3);
  m.observe(2 << 20, 17e-3);
  m.observe(1 << 20, 8.6e-3);
  EXPECT_TRUE(m.estimate().known());
}

}  // namespace
}  // namespace nezha::multirail

namespace nezha::multirail {
namespace {

TEST(RailCostModelJump, OneSampleFarOffIsActedOnAtOnceWhenEnabled) {
  RailCostModelOptions opt;
  opt.jump_ratio = 2.0;
  RailCostModel m(opt);
  for (int i = 0; i < 20; ++i)
    m.observe((i % 2 ? 1 : 4) << 20, 100e-6 + ((i % 2 ? 1 : 4) << 20) * 8 / 1e9);
  ASSERT_NEAR(m.estimate().beta_gbps, 1.0, 0.05);
  m.observe(4 << 20, 100e-6 + (4 << 20) * 8 / 0.25e9);  // the link now runs at 250 Mbit/s
  EXPECT_LT(m.estimate().beta_gbps, 0.4);

  RailCostModel cautious;  // default: no jump, a single far-off sample is an outlier
  for (int i = 0; i < 20; ++i)
    cautious.observe((i % 2 ? 1 : 4) << 20, 100e-6 + ((i % 2 ? 1 : 4) << 20) * 8 / 1e9);
  cautious.observe(4 << 20, 100e-6 + (4 << 20) * 8 / 0.25e9);
  EXPECT_GT(cautious.estimate().beta_gbps, 0.8);
}

}  // namespace
}  // namespace nezha::multirail
