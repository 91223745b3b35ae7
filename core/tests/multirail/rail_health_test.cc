#include "multirail/rail_health.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace nezha::multirail {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const RailHealth::TimePoint t0 = Clock::time_point{} + seconds(1000);

TEST(RailHealth, StartsUp) {
  RailHealth h("eth1");
  EXPECT_EQ(h.state(), RailState::kUp);
  EXPECT_TRUE(h.is_usable());
  EXPECT_STREQ(h.state_name(), "up");
  EXPECT_FALSE(h.probe_due(t0));
}

TEST(RailHealth, FailProbeRecover) {
  RailHealth h("eth1");
  h.mark_failed(t0);
  EXPECT_EQ(h.state(), RailState::kDown);
  EXPECT_FALSE(h.is_usable());
  EXPECT_STREQ(h.state_name(), "down");
  EXPECT_FALSE(h.probe_due(t0 + milliseconds(499)));
  EXPECT_TRUE(h.probe_due(t0 + milliseconds(500)));
  h.begin_probe(t0 + milliseconds(500));
  EXPECT_EQ(h.state(), RailState::kProbing);
  EXPECT_STREQ(h.state_name(), "probing");
  EXPECT_FALSE(h.is_usable());
  EXPECT_FALSE(h.probe_due(t0 + seconds(10)));  // one probe at a time
  h.probe_succeeded(t0 + milliseconds(600));
  EXPECT_EQ(h.state(), RailState::kUp);
  EXPECT_TRUE(h.is_usable());
}

TEST(RailHealth, BackOffDoublesPerFailedProbeUpToTheCap) {
  RailHealth h("eth1");
  RailHealth::TimePoint now = t0;
  h.mark_failed(now);
  long long expected_ms = 500;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(h.current_backoff(), milliseconds(expected_ms)) << "failure " << i + 1;
    EXPECT_EQ(h.next_probe_at(), now + milliseconds(expected_ms));
    now = h.next_probe_at();
    ASSERT_TRUE(h.probe_due(now));
    h.begin_probe(now);
    h.probe_failed(now);
    expected_ms = std::min<long long>(expected_ms * 2, 30000);
  }
  EXPECT_EQ(h.current_backoff(), seconds(30));
}

TEST(RailHealth, FlappingRailKeepsItsBackOffAQuietOneStartsOver) {
  RailHealth h("eth1");
  h.mark_failed(t0);
  h.begin_probe(t0 + milliseconds(500));
  h.probe_succeeded(t0 + milliseconds(500));
  h.mark_failed(t0 + seconds(2));  // failed again soon after coming back: flapping
  EXPECT_EQ(h.current_backoff(), seconds(1));
  EXPECT_EQ(h.failures_in_a_row(), 2);
  h.begin_probe(t0 + seconds(3));
  h.probe_succeeded(t0 + seconds(3));
  h.mark_failed(t0 + seconds(3) + seconds(61));  // up for longer than the flap window
  EXPECT_EQ(h.current_backoff(), milliseconds(500));
  EXPECT_EQ(h.failures_in_a_row(), 1);
}

TEST(RailHealth, RepeatedReportsOfOneFailureCountOnce) {
  RailHealth h("eth1");
  h.mark_failed(t0);
  h.mark_failed(t0 + milliseconds(10));  // another op in flight saw the same failure
  EXPECT_EQ(h.current_backoff(), milliseconds(500));
  EXPECT_EQ(h.next_probe_at(), t0 + milliseconds(500));
}

TEST(RailHealth, FailureDuringProbeCountsAsFailedProbe) {
  RailHealth h("eth1");
  h.mark_failed(t0);
  h.begin_probe(t0 + seconds(1));
  h.mark_failed(t0 + seconds(1));
  EXPECT_EQ(h.state(), RailState::kDown);
  EXPECT_EQ(h.current_backoff(), seconds(1));
}

TEST(RailHealth, InvalidTransitionsNameTheRail) {
  RailHealth h("10.50.0.0/24");
  EXPECT_THROW(h.probe_succeeded(t0), InvalidArgument);
  EXPECT_THROW(h.probe_failed(t0), InvalidArgument);
  EXPECT_THROW(h.begin_probe(t0), InvalidArgument);
  h.mark_failed(t0);
  try {
    h.begin_probe(t0 + milliseconds(100));  // back-off not over
    FAIL() << "begin_probe before the back-off elapsed must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("10.50.0.0/24"), std::string::npos) << e.what();
  }
}

TEST(RailHealth, RejectsInvalidOptions) {
  RailHealthOptions opt;
  opt.initial_backoff = milliseconds(0);
  EXPECT_THROW(RailHealth("eth1", opt), InvalidArgument);
  opt = {};
  opt.max_backoff = milliseconds(100);
  EXPECT_THROW(RailHealth("eth1", opt), InvalidArgument);
}

}  // namespace
}  // namespace nezha::multirail
