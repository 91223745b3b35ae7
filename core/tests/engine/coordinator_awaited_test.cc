// Coordinator::fewest_requests_missing: how many requests rank 0 must receive, at least, before
// some pending tensor is complete; rank 0 sleeps through fewer (MessagePath::wake_after_messages),
// so it must never say more than the fewest a tensor lacks.
#include <gtest/gtest.h>

#include "coordinator_requests.h"
#include "engine/negotiation/coordinator.h"

namespace nezha::engine {
namespace {

using testing::allreduce;
using testing::options;
using testing::t0;

TEST(CoordinatorAwaitedTest, NothingPendingAwaitsOneMessage) {
  Coordinator c(options(4));
  EXPECT_EQ(c.fewest_requests_missing(), 1);
}

TEST(CoordinatorAwaitedTest, CountsTheOtherRanksATensorLacks) {
  Coordinator c(options(4));
  c.submit(0, {allreduce("x")}, t0);
  EXPECT_EQ(c.fewest_requests_missing(), 3);
  c.submit(2, {allreduce("x")}, t0);
  EXPECT_EQ(c.fewest_requests_missing(), 2);
  c.submit(3, {allreduce("x")}, t0);
  EXPECT_EQ(c.fewest_requests_missing(), 1);
}

TEST(CoordinatorAwaitedTest, TheTensorClosestToCompleteDecides) {
  Coordinator c(options(4));
  c.submit(0, {allreduce("x")}, t0);
  c.submit(1, {allreduce("y")}, t0);
  c.submit(2, {allreduce("y")}, t0);
  // x lacks ranks 1, 2, 3; y lacks rank 3 (and rank 0, whose own submission is no message).
  EXPECT_EQ(c.fewest_requests_missing(), 1);
  Coordinator d(options(4));
  d.submit(0, {allreduce("x")}, t0);
  d.submit(0, {allreduce("y")}, t0);
  d.submit(1, {allreduce("y")}, t0);
  EXPECT_EQ(d.fewest_requests_missing(), 2);  // y lacks 2 and 3; x lacks three
}

TEST(CoordinatorAwaitedTest, ATensorOnlyRankZeroLacksAwaitsOneMessage) {
  Coordinator c(options(3));
  c.submit(1, {allreduce("x")}, t0);
  c.submit(2, {allreduce("x")}, t0);
  EXPECT_EQ(c.fewest_requests_missing(), 1);
}

TEST(CoordinatorAwaitedTest, AReadyTensorHeldForFusionAwaitsOneMessage) {
  CoordinatorOptions o = options(4);
  o.cycle_time_s = 10;  // held for fusion, not taken, while the cycle runs
  Coordinator c(o);
  for (int r = 0; r < 4; ++r) c.submit(r, {allreduce("x")}, t0);
  c.submit(0, {allreduce("z")}, t0);  // lacks three
  ASSERT_TRUE(c.take_ready(t0).empty());
  EXPECT_EQ(c.fewest_requests_missing(), 1);  // x is due at the cycle's end, with no message
}

}  // namespace
}  // namespace nezha::engine
