// RailFailover: rank 0's decisions for a failed rail, from the first report to re-admission.
#include "engine/failover/rail_failover.h"

#include <gtest/gtest.h>

#include <chrono>

#include "common/error.h"

namespace nezha::engine {
namespace {

using std::chrono::milliseconds;

multirail::RailHealthOptions fast_backoff() {
  multirail::RailHealthOptions o;
  o.initial_backoff = milliseconds(100);
  o.max_backoff = milliseconds(400);
  o.flap_window = milliseconds(10000);
  return o;
}

std::vector<multirail::RailEstimate> estimates(double beta0, double beta1, double beta2) {
  std::vector<multirail::RailEstimate> e(3);
  e[0].beta_gbps = beta0;
  e[1].beta_gbps = beta1;
  e[2].beta_gbps = beta2;
  return e;
}

// Two ranks: `rail` fails on rank 1 and both ranks report it drained (so it waits for a probe).
void fail_and_drain(RailFailover& f, int rail, Clock::time_point now) {
  f.on_failed(rail, 1, "x", false, 0, now);
  f.on_drained(rail, 0, 3, {});
  f.on_drained(rail, 1, 3, {});
}

TEST(RailFailover, FailureIsBroadcastOnceAndRedoStartsAtTheSlowestRank) {
  RailFailover f(3, {"a", "b", "c"}, fast_backoff());
  auto t0 = Clock::now();
  auto d = f.on_failed(1, 2, "reset by peer", false, 0, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kDown);
  EXPECT_NE(d.broadcast[0].text.find("rail 'b' failed on rank 2: reset by peer"), std::string::npos);
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(f.on_failed(1, 0, "again", false, 0, t0).broadcast.empty());  // same failure seen elsewhere

  EXPECT_TRUE(f.on_drained(1, 0, 17, estimates(1, 1, 5)).broadcast.empty());
  EXPECT_TRUE(f.on_drained(1, 2, 15, estimates(1, 1, 5)).broadcast.empty());
  d = f.on_drained(1, 1, 16, estimates(1, 1, 5));
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kRedo);
  EXPECT_EQ(d.broadcast[0].value, 15u);   // first share not completed everywhere
  EXPECT_EQ(d.broadcast[0].target, 2);    // fastest rail still up
}

TEST(RailFailover, ProbeAfterBackoffReadmitsWhenEveryRankSucceeds) {
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  fail_and_drain(f, 0, t0);
  EXPECT_TRUE(f.start_due_probes(t0 + milliseconds(50)).broadcast.empty());
  ASSERT_TRUE(f.next_wakeup().has_value());
  auto d = f.start_due_probes(t0 + milliseconds(100));
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kProbe);
  EXPECT_TRUE(f.on_probe_ready(0, 1).broadcast.empty());
  d = f.on_probe_ready(0, 0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kConnect);
  EXPECT_TRUE(f.on_probe_result(0, 0, true, "", t0).broadcast.empty());
  d = f.on_probe_result(0, 1, true, "", t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kUp);
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, true}));
}

TEST(RailFailover, FailedProbeAbortsEverywhereAndBacksOffLonger) {
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  fail_and_drain(f, 1, t0);
  f.start_due_probes(t0 + milliseconds(100));
  f.on_probe_ready(1, 0);
  f.on_probe_ready(1, 1);
  auto t1 = t0 + milliseconds(150);
  auto d = f.on_probe_result(1, 1, false, "connect timed out", t1);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kProbeFailed);
  EXPECT_NE(d.broadcast[0].text.find("rank 1: connect timed out"), std::string::npos);
  EXPECT_TRUE(f.on_probe_result(1, 0, true, "", t1).broadcast.empty());  // stale: attempt is over
  // Second failure within the flap window: the back-off doubled.
  EXPECT_TRUE(f.start_due_probes(t1 + milliseconds(150)).broadcast.empty());
  EXPECT_EQ(f.start_due_probes(t1 + milliseconds(200)).broadcast.size(), 1u);
}

TEST(RailFailover, StallIsCheckedWithEveryRankAndALateRankCancelsIt) {
  RailFailover f(3, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  auto d = f.on_failed(1, 2, "silent", true, 41, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kQuery);
  EXPECT_EQ(d.broadcast[0].value, 41u);
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, true}));  // not down yet
  EXPECT_TRUE(f.on_failed(1, 0, "silent too", true, 41, t0).broadcast.empty());  // one check at a time
  EXPECT_TRUE(f.on_query_reply(1, 0, 41, false, t0).broadcast.empty());
  EXPECT_TRUE(f.on_query_reply(1, 1, 41, true, t0).broadcast.empty());  // rank 1 is late: no failover
  EXPECT_TRUE(f.on_query_reply(1, 2, 41, false, t0).broadcast.empty());
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, true}));
  // Reported again later, and this time every rank is at or past the operation: down.
  f.on_failed(1, 2, "silent", true, 41, t0);
  for (int rank : {0, 1}) EXPECT_TRUE(f.on_query_reply(1, rank, 41, false, t0).broadcast.empty());
  d = f.on_query_reply(1, 2, 41, false, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kDown);
  EXPECT_NE(d.broadcast[0].text.find("rail 'b' failed on rank 2: silent"), std::string::npos);
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, false}));
}

TEST(RailFailover, StallInAnEarlierOperationRestartsTheCheckThere) {
  // After a cut, rank 0 finished operation 7 (its last bytes were already buffered) and stalls in
  // 8; rank 1 never got those bytes and stalls in 7. Checking 8 alone would find rank 1 "behind".
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  auto d = f.on_failed(0, 0, "silent in 8", true, 8, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].value, 8u);
  d = f.on_failed(0, 1, "silent in 7", true, 7, t0);  // earlier: check 7 instead
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kQuery);
  EXPECT_EQ(d.broadcast[0].value, 7u);
  EXPECT_TRUE(f.on_failed(0, 0, "silent in 8", true, 8, t0).broadcast.empty());  // later: ignored
  // Rank 1's answer to the superseded check of 8 ("behind") must not cancel the check of 7.
  EXPECT_TRUE(f.on_query_reply(0, 1, 8, true, t0).broadcast.empty());
  EXPECT_TRUE(f.on_query_reply(0, 0, 7, false, t0).broadcast.empty());
  d = f.on_query_reply(0, 1, 7, false, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kDown);
  EXPECT_NE(d.broadcast[0].text.find("failed on rank 1: silent in 7"), std::string::npos);
}

TEST(RailFailover, StallCheckDoesNotTakeDownTheLastRailLeft) {
  // Rail b went down (an error) while rail a's stall was being checked: a is all that is left.
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  ASSERT_EQ(f.on_failed(0, 1, "silent", true, 5, t0).broadcast.size(), 1u);  // the check of a
  ASSERT_EQ(f.on_failed(1, 0, "connection reset", false, 0, t0).broadcast.size(), 1u);  // b down
  EXPECT_TRUE(f.on_query_reply(0, 0, 5, false, t0).broadcast.empty());
  EXPECT_TRUE(f.on_query_reply(0, 1, 5, false, t0).broadcast.empty());
  EXPECT_EQ(f.usable(), (std::vector<bool>{true, false}));
}

TEST(RailFailover, ErrorDuringAStallCheckTakesTheRailDownAtOnce) {
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  f.on_failed(0, 1, "silent", true, 3, t0);
  auto d = f.on_failed(0, 0, "connection reset", false, 0, t0);
  ASSERT_EQ(d.broadcast.size(), 1u);
  EXPECT_EQ(d.broadcast[0].kind, RailEventKind::kDown);
  EXPECT_TRUE(f.on_query_reply(0, 1, 3, false, t0).broadcast.empty());  // the check is over
}

TEST(RailFailover, LosingTheLastUsableRailIsFatal) {
  RailFailover f(2, {"a", "b"}, fast_backoff());
  auto t0 = Clock::now();
  EXPECT_EQ(f.on_failed(0, 1, "x", false, 0, t0).fatal, "");
  // A stall there is not acted on (it may echo the other rail's failure); an error is fatal.
  EXPECT_EQ(f.on_failed(1, 0, "silent", true, 0, t0).fatal, "");
  EXPECT_EQ(f.usable(), (std::vector<bool>{false, true}));
  auto d = f.on_failed(1, 0, "link down", false, 0, t0);
  EXPECT_NE(d.fatal.find("rail 'b' failed on rank 0 and no other rail is up: link down"), std::string::npos);
}

TEST(RailFailover, OutOfRangeReportsAreProtocolErrors) {
  RailFailover f(2, {"a", "b"});
  EXPECT_THROW(f.on_failed(2, 0, "x", false, 0, Clock::now()), ProtocolError);
  EXPECT_THROW(f.on_drained(0, 5, 0, {}), ProtocolError);
}

}  // namespace
}  // namespace nezha::engine
