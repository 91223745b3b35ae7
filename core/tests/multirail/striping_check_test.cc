// Striping checked on whole operations: the verdict per size class (StripingCheck) and how the rail
// table plans by it, for negotiation and for cache rounds alike.
#include "multirail/striping_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "common/error.h"
#include "multirail/rail_table.h"

namespace nezha::multirail {
namespace {

constexpr double kMs = 1e-3;

void feed(StripingCheck& c, size_t bytes, bool striped, double seconds, int times) {
  for (int i = 0; i < times; ++i) c.observe(bytes, striped, seconds);
}

TEST(StripingCheck, ClassesArePowersOfTwoFromTwoKibibytesToTheMidBandsEnd) {
  EXPECT_EQ(check_class(8), -1);
  EXPECT_EQ(check_class(2048), -1);
  EXPECT_EQ(check_class(2049), 0);
  EXPECT_EQ(check_class(4096), 0);
  EXPECT_EQ(check_class(4097), 1);
  EXPECT_EQ(check_class(60000), 4);
  EXPECT_EQ(check_class(65536), 4);  // with the payloads just below it, not the mid band
  EXPECT_EQ(check_class(65537), 5);
  EXPECT_EQ(check_class(262144), kCheckClasses - 1);
  EXPECT_EQ(check_class(262145), -1);
  EXPECT_EQ(check_class(size_t{1} << 30), -1);
}

TEST(StripingCheck, NoVerdictUntilBothWaysAreMeasured) {
  StripingCheck c;
  feed(c, 65536, true, 2.5 * kMs, 20);  // striped and slow, but nothing to compare with
  EXPECT_EQ(min_striped_bytes({c}), 0u);
  feed(c, 65536, false, 2.0 * kMs, kCheckMinSamples - 1);
  EXPECT_EQ(min_striped_bytes({c}), 0u);
  EXPECT_EQ(c.median_seconds(4, false), 0);
  c.observe(60000, false, 2.0 * kMs);  // same class
  EXPECT_EQ(min_striped_bytes({c}), 65537u);
  EXPECT_DOUBLE_EQ(c.median_seconds(4, true), 2.5 * kMs);
  EXPECT_DOUBLE_EQ(c.median_seconds(4, false), 2.0 * kMs);
}

TEST(StripingCheck, StripingStopsOnlyWhenMoreThanTheMarginSlower) {
  StripingCheck pays, marginal, loses;
  feed(pays, 32768, true, 1.0 * kMs, 5);
  feed(pays, 32768, false, 1.2 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({pays}), 0u);
  feed(marginal, 32768, true, 1.05 * kMs, 5);  // 5 % slower: within kCheckLossMargin
  feed(marginal, 32768, false, 1.0 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({marginal}), 0u);
  feed(loses, 32768, true, 1.15 * kMs, 5);
  feed(loses, 32768, false, 1.0 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({loses}), 32769u);
}

TEST(StripingCheck, TheLargestClassWhereStripingLostSetsTheFloor) {
  StripingCheck c;
  feed(c, 16384, true, 1.0 * kMs, 5);  // class 2: lost
  feed(c, 16384, false, 0.8 * kMs, 5);
  feed(c, 131072, true, 2.0 * kMs, 5);  // class 5: won
  feed(c, 131072, false, 3.0 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({c}), 16385u);
  feed(c, 262144, true, 5.0 * kMs, 5);  // class 6: lost, so everything up to 256 KiB runs whole
  feed(c, 262144, false, 4.0 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({c}), 262145u);
}

TEST(StripingCheck, OneStallEachWayDoesNotDecide) {
  StripingCheck c;
  feed(c, 65536, true, 1.0 * kMs, 6);
  c.observe(65536, true, 50 * kMs);  // a stalled operation
  feed(c, 65536, false, 1.2 * kMs, 6);
  c.observe(65536, false, 0.1 * kMs);  // and one that looked implausibly fast
  EXPECT_EQ(min_striped_bytes({c}), 0u);
}

TEST(StripingCheck, FollowsAChangeWithinOneWindow) {
  StripingCheck c;
  feed(c, 65536, true, 1.5 * kMs, kCheckWindow);
  feed(c, 65536, false, 1.0 * kMs, kCheckWindow);
  EXPECT_EQ(min_striped_bytes({c}), 65537u);
  // The host got cores to spare: striping now halves the time. The window's majority decides.
  feed(c, 65536, true, 0.5 * kMs, kCheckWindow / 2);
  EXPECT_EQ(min_striped_bytes({c}), 65537u);
  c.observe(65536, true, 0.5 * kMs);
  EXPECT_EQ(min_striped_bytes({c}), 0u);
}

TEST(StripingCheck, IgnoresWhatItDoesNotCheck) {
  StripingCheck c;
  for (size_t bytes : {size_t{8}, size_t{2048}, size_t{262145}, size_t{64} << 20}) {
    feed(c, bytes, true, 9 * kMs, 10);
    feed(c, bytes, false, 1 * kMs, 10);
  }
  feed(c, 65536, true, std::nan(""), 10);
  feed(c, 65536, true, -1, 10);
  feed(c, 65536, false, 1 * kMs, 10);
  EXPECT_EQ(min_striped_bytes({c}), 0u);
  EXPECT_EQ(c.median_seconds(-1, true), 0);
  EXPECT_EQ(c.median_seconds(kCheckClasses, true), 0);
}

TEST(StripingCheck, TheSlowestRanksMedianEachWayDecides) {
  // Rank 0 sends the response before it starts, so its peers start first and it often finishes
  // first: alone, its times say striping loses (80 us whole against 200 striped). Rank 1 finished
  // last both ways and its times are the operation's: striping pays.
  std::vector<StripingCheck> ranks(3);
  feed(ranks[0], 32768, false, 0.08 * kMs, 5);
  feed(ranks[0], 32768, true, 0.20 * kMs, 5);
  EXPECT_EQ(min_striped_bytes({ranks[0]}), 32769u);
  feed(ranks[1], 32768, false, 0.90 * kMs, 5);
  feed(ranks[1], 32768, true, 0.50 * kMs, 5);
  EXPECT_EQ(min_striped_bytes(ranks), 0u);
  // A rank with too few times one way does not count for that way.
  feed(ranks[2], 32768, true, 5.0 * kMs, kCheckMinSamples - 1);
  EXPECT_EQ(min_striped_bytes(ranks), 0u);
  ranks[2].observe(32768, true, 5.0 * kMs);
  EXPECT_EQ(min_striped_bytes(ranks), 32769u);
  EXPECT_EQ(min_striped_bytes({}), 0u);
}

// Through the rail table: two equal rails, so the models stripe every checked payload.
std::unique_ptr<RailTable> two_equal_rails() {
  RailCostModelOptions o;
  o.min_samples = 2;
  auto t = std::make_unique<RailTable>(std::vector<RailDescription>{{"a"}, {"b"}}, o);
  for (int rail : {0, 1})
    for (size_t bytes : {size_t{4096}, size_t{4096}, size_t{4096}, size_t{1} << 20, size_t{2} << 20})
      t->observe(rail, bytes, 100e-6 + static_cast<double>(bytes) * 8 / 1e9);
  return t;
}

Plan plan_allreduce(RailTable& t, size_t bytes, PlanSource source = PlanSource::kNegotiation,
                    const std::vector<RailEstimate>& round = {}) {
  OpToPlan op{bytes / 4, 4, true, true};
  return t.plan(op, source, round);
}

int explored(uint64_t from, uint64_t to) {
  int n = 0;
  for (uint64_t i = from; i <= to; ++i) n += check_explores(i);
  return n;
}

TEST(StripingCheck, ExploresInRunsAtTheEndOfEachPeriod) {
  // 16 plans, the last 4 the other way, four times; then 64 plans, the last 4 the other way.
  EXPECT_EQ(explored(1, kCheckEarlyPlans), 16);
  EXPECT_EQ(explored(kCheckEarlyPlans + 1, kCheckEarlyPlans + 4 * kCheckExplorePeriod), 16);
  EXPECT_FALSE(check_explores(0));
  EXPECT_FALSE(check_explores(12));
  for (uint64_t n : {13, 14, 15, 16, 61, 62, 63, 64, 125, 128}) EXPECT_TRUE(check_explores(n)) << n;
  for (uint64_t n : {17, 65, 100, 124, 129}) EXPECT_FALSE(check_explores(n)) << n;
}

TEST(StripingCheckInRailTable, WithoutAVerdictSomeContestedPlansRunWhole) {
  const auto table = two_equal_rails();
  RailTable& t = *table;
  int whole = 0;
  for (int i = 1; i <= kCheckEarlyPlans + kCheckExplorePeriod; ++i) {
    const Plan p = plan_allreduce(t, 65536);
    EXPECT_EQ(p.striped, !check_explores(static_cast<uint64_t>(i))) << "plan " << i << ": " << p.why;
    if (!p.striped) {
      ++whole;
      EXPECT_NE(p.why.find("whole for the measure"), std::string::npos) << p.why;
      ASSERT_EQ(p.shares.size(), 1u);
      EXPECT_EQ(p.shares[0].count, 65536u / 4);
    }
  }
  EXPECT_EQ(whole, 16 + kCheckExploreRun);
  // Payloads the models do not stripe, and large ones, are not touched.
  for (int i = 0; i < 2 * kCheckExplorePeriod; ++i) {
    EXPECT_FALSE(plan_allreduce(t, 1024).striped);
    EXPECT_TRUE(plan_allreduce(t, 4 << 20).striped);
  }
}

TEST(StripingCheckInRailTable, BelowTheMeasuredFloorContestedPlansRunWholeAndSomeStriped) {
  const auto table = two_equal_rails();
  RailTable& t = *table;
  // Runs of each kind: the first of a run follows the other kind and is not counted.
  for (int i = 0; i <= kCheckMinSamples; ++i) t.observe_operation(65536, true, 2.5 * kMs);
  for (int i = 0; i < kCheckMinSamples; ++i) t.observe_operation(65536, false, 2.0 * kMs);
  for (const RailEstimate& e : t.estimates()) EXPECT_EQ(e.min_striped_bytes, 0u);  // four whole
  t.observe_operation(65536, false, 2.0 * kMs);
  for (const RailEstimate& e : t.estimates()) EXPECT_EQ(e.min_striped_bytes, 65537u);
  int striped = 0;
  for (int i = 1; i <= kCheckEarlyPlans + 2 * kCheckExplorePeriod; ++i) {
    const Plan p = plan_allreduce(t, 49152);
    EXPECT_EQ(p.striped, check_explores(static_cast<uint64_t>(i))) << "plan " << i << ": " << p.why;
    if (p.striped) {
      ++striped;
      EXPECT_NE(p.why.find("striped for the measure"), std::string::npos) << p.why;
    } else {
      EXPECT_NE(p.why.find("striping measured slower below 65537 B"), std::string::npos) << p.why;
    }
  }
  EXPECT_EQ(striped, 16 + 2 * kCheckExploreRun);
  // Above the floor the models decide (and the exploration runs some whole).
  int whole = 0;
  for (int i = 0; i < kCheckEarlyPlans; ++i) whole += !plan_allreduce(t, 131072).striped;
  EXPECT_EQ(whole, 16);
  // A broadcast-like striped operation is not what the check measured: the models decide.
  OpToPlan other{49152 / 4, 4, true, false};
  for (int i = 0; i < kCheckEarlyPlans; ++i) EXPECT_TRUE(t.plan(other, PlanSource::kNegotiation).striped);
}

TEST(StripingCheckInRailTable, RoundsPlanByTheCoordinatorsFloorAndAgreeOnEveryRank) {
  // Rank 0 measured striping slower up to 64 KiB; ranks 1 and 2 measured nothing themselves.
  std::vector<RailEstimate> coordinator = two_equal_rails()->estimates();
  for (RailEstimate& e : coordinator) e.min_striped_bytes = 65537;
  auto rank1_table = two_equal_rails(), rank2_table = two_equal_rails();
  RailTable &rank1 = *rank1_table, &rank2 = *rank2_table;
  rank2.observe_operation(65536, true, 1 * kMs);  // its own view must not matter in a round
  for (int i = 0; i < kCheckEarlyPlans + 2 * kCheckExplorePeriod; ++i) {
    const Plan a = plan_allreduce(rank1, 65536, PlanSource::kRound, coordinator);
    const Plan b = plan_allreduce(rank2, 65536, PlanSource::kRound, coordinator);
    ASSERT_EQ(a.shares.size(), b.shares.size()) << "round plan " << i;
    for (size_t s = 0; s < a.shares.size(); ++s) {
      EXPECT_EQ(a.shares[s].rail, b.shares[s].rail);
      EXPECT_EQ(a.shares[s].count, b.shares[s].count);
    }
    EXPECT_EQ(a.striped, check_explores(static_cast<uint64_t>(i) + 1)) << "round plan " << i;
  }
  // Negotiation plans on rank 1 use its own estimates (no floor): striped, their own count.
  EXPECT_TRUE(plan_allreduce(rank1, 65536).striped);
  // A floor on the wire beyond the checked sizes leaves large payloads to the models.
  for (RailEstimate& e : coordinator) e.min_striped_bytes = uint64_t{1} << 40;
  EXPECT_TRUE(plan_allreduce(rank1, 4 << 20, PlanSource::kRound, coordinator).striped);
}

TEST(StripingCheckInRailTable, PeersSendTheirTimesAndRankZeroChecksEveryRanks) {
  const auto peer_table = two_equal_rails();
  RailTable& peer = *peer_table;
  peer.report_operations_to_coordinator();
  peer.observe_operation(1024, true, 1 * kMs);       // not checked: not sent
  peer.observe_operation(1 << 20, true, 1 * kMs);    // not checked: not sent
  for (int i = 0; i < 300; ++i) peer.observe_operation(65536, i < 150, (1 + i) * 1e-6);
  EXPECT_EQ(peer.estimates()[0].min_striped_bytes, 0u);  // its own times are rank 0's to judge
  std::vector<OperationTime> sent = peer.take_operation_times();
  ASSERT_EQ(sent.size(), kMaxReportedOperations);  // the latest (of 298: two followed the other kind)
  EXPECT_EQ(sent.back().seconds, 300e-6f);
  EXPECT_EQ(sent.back().bytes, 65536u);
  EXPECT_FALSE(sent.back().striped);
  EXPECT_TRUE(peer.take_operation_times().empty());

  const auto coordinator_table = two_equal_rails();
  RailTable& coordinator = *coordinator_table;
  for (int i = 0; i <= kCheckMinSamples; ++i) coordinator.observe_operation(32768, false, 0.08 * kMs);
  for (int i = 0; i <= kCheckMinSamples; ++i) coordinator.observe_operation(32768, true, 0.20 * kMs);
  EXPECT_EQ(coordinator.estimates()[1].min_striped_bytes, 32769u);  // rank 0 alone: striping loses
  EXPECT_TRUE(coordinator.take_operation_times().empty());  // rank 0 checks its own at once
  std::vector<OperationTime> rank3;
  for (int i = 0; i < kCheckMinSamples; ++i) {  // the last rank to finish: striping pays
    rank3.push_back({32768, false, 0.9e-3f});
    rank3.push_back({32768, true, 0.5e-3f});
  }
  coordinator.observe_rank_operations(3, rank3);
  for (const RailEstimate& e : coordinator.estimates()) EXPECT_EQ(e.min_striped_bytes, 0u);
  EXPECT_THROW(coordinator.observe_rank_operations(0, rank3), InvalidArgument);
  EXPECT_THROW(coordinator.observe_rank_operations(-1, rank3), InvalidArgument);
}

TEST(StripingCheckInRailTable, AnOperationAfterTheOtherKindInItsClassIsNotCounted) {
  const auto table = two_equal_rails();
  RailTable& t = *table;
  t.report_operations_to_coordinator();
  t.observe_operation(65536, true, 1 * kMs);   // the first: after nothing of its class
  t.observe_operation(65536, true, 2 * kMs);   // counted
  t.observe_operation(32768, false, 3 * kMs);  // another class: its own first
  t.observe_operation(65536, true, 4 * kMs);   // counted: its class's last was striped
  t.observe_operation(65536, false, 5 * kMs);  // follows a striped one: not counted
  t.observe_operation(65536, false, 6 * kMs);  // counted
  std::vector<OperationTime> sent = t.take_operation_times();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].seconds, 2e-3f);
  EXPECT_EQ(sent[1].seconds, 4e-3f);
  EXPECT_EQ(sent[2].seconds, 6e-3f);
}

TEST(StripingCheckInRailTable, OneRailHasNothingToCheck) {
  RailTable t({{"only"}}, RailCostModelOptions{});
  t.report_operations_to_coordinator();
  t.observe_operation(65536, false, 1 * kMs);
  EXPECT_TRUE(t.take_operation_times().empty());
}

TEST(StripingCheckInRailTable, AFloorOnAnUnusableRailDoesNotCount) {
  RailTable t({{"a"}, {"b"}, {"c"}}, RailCostModelOptions{});
  for (int rail : {0, 1, 2})
    for (size_t bytes : {size_t{4096}, size_t{4096}, size_t{4096}, size_t{1} << 20, size_t{2} << 20,
                         size_t{4} << 20})
      t.observe(rail, bytes, 100e-6 + static_cast<double>(bytes) * 8 / 1e9);
  std::vector<RailEstimate> est = t.estimates();
  est[2].min_striped_bytes = 65537;  // only the rail that is down carries it
  t.set_state(2, RailState::kDown);
  int striped = 0;
  for (int i = 0; i < kCheckEarlyPeriod - kCheckExploreRun; ++i)
    striped += plan_allreduce(t, 65536, PlanSource::kRound, est).striped;
  EXPECT_EQ(striped, kCheckEarlyPeriod - kCheckExploreRun);
}

}  // namespace
}  // namespace nezha::multirail
