// ShareBalancer: which ranges each rail of a balanced allreduce is handed, on the leader.
#include "engine/execution/share_balancer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include <algorithm>
#include <thread>
#include <vector>

namespace nezha::engine {
namespace {

using Range = ShareBalancer::Range;

// Claims for `order`'s parts in turn (one claim each per turn, skipping parts that got nothing)
// until every part is told nothing is left; returns every range, checking no part gets more after
// its first empty answer.
std::vector<std::vector<Range>> claim_all(ShareBalancer& b, const std::vector<size_t>& order) {
  std::vector<std::vector<Range>> got(b.parts());
  std::vector<bool> done(b.parts(), false);
  while (std::count(done.begin(), done.end(), false) > 0) {
    for (size_t p : order) {
      if (done[p]) continue;
      Range r = b.claim(p);
      if (r.count == 0) done[p] = true;
      else got[p].push_back(r);
    }
  }
  return got;
}

// Every element of [0, total) is in exactly one range.
void expect_exact_cover(const std::vector<std::vector<Range>>& got, size_t total) {
  std::vector<int> hits(total, 0);
  for (const auto& part : got)
    for (const Range& r : part) {
      ASSERT_LE(r.offset + r.count, total);
      for (size_t i = r.offset; i < r.offset + r.count; ++i) ++hits[i];
    }
  for (size_t i = 0; i < total; ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
}

TEST(ShareBalancerTest, EqualRailsEachDrainTheirOwnShareInHalvingRanges) {
  ShareBalancer b({{0, 0, 1000}, {1, 1000, 1000}}, 100, 10);
  auto got = claim_all(b, {0, 1});
  expect_exact_cover(got, 2000);
  // Half of what is left, rounded up to the alignment, until less than two minimum ranges are left.
  std::vector<size_t> want0 = {500, 250, 130, 120};
  ASSERT_EQ(got[0].size(), want0.size());
  for (size_t i = 0; i < want0.size(); ++i) EXPECT_EQ(got[0][i].count, want0[i]) << i;
  EXPECT_EQ(got[0][0].offset, 0u);
  EXPECT_EQ(got[1][0].offset, 1000u);  // a rail starts on its own share
  for (size_t p = 0; p < 2; ++p) EXPECT_EQ(b.claimed(p).size(), got[p].size());
}

// Runs the balancer against a clock: part p moves rates[p] elements per second after a start-up of
// `startup` seconds per range, claims its next range when its last one ends, and ends when told
// nothing is left. Returns each part's end time; every element is covered exactly once.
std::vector<double> run_clocked(ShareBalancer& b, const std::vector<double>& rates, double startup, size_t total) {
  using clock = std::chrono::steady_clock;
  const clock::time_point t0{};
  std::vector<double> free_at(b.parts(), 0.0), end(b.parts(), -1.0);
  std::vector<std::vector<Range>> got(b.parts());
  for (;;) {
    size_t p = b.parts();  // the part whose range ends first claims next
    for (size_t q = 0; q < b.parts(); ++q)
      if (end[q] < 0 && (p == b.parts() || free_at[q] < free_at[p])) p = q;
    if (p == b.parts()) break;
    const Range r = b.claim(p, t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(free_at[p])));
    if (r.count == 0) {
      end[p] = free_at[p];
      continue;
    }
    got[p].push_back(r);
    free_at[p] += startup + static_cast<double>(r.count) / rates[p];
  }
  expect_exact_cover(got, total);
  return end;
}

TEST(ShareBalancerTest, TheLastRangesShrinkToTheTailMinimum) {
  ShareBalancer b({{0, 0, 1000}, {1, 1000, 1000}}, 100, 10, 0, 25);
  auto got = claim_all(b, {0, 1});
  expect_exact_cover(got, 2000);
  // Halves down to the minimum as without a tail (500, 250, 130); then, with fewer than two minimum
  // ranges left, halves down to the tail minimum.
  std::vector<size_t> want0 = {500, 250, 130, 60, 30, 30};
  ASSERT_EQ(got[0].size(), want0.size());
  for (size_t i = 0; i < want0.size(); ++i) EXPECT_EQ(got[0][i].count, want0[i]) << i;
}

// A misjudged plan (equal shares; rail 1 runs at 0.7 of rail 0's rate): the rail that finishes first
// idles until the other's last range ends. With the tail minimum that wait is about one tail range;
// without it, up to one minimum range.
TEST(ShareBalancerTest, TheTailMinimumShortensTheIdleEndOfAMisjudgedPlan) {
  const std::vector<multirail::RailShare> plan = {{0, 0, 32 << 20}, {1, 32 << 20, 32 << 20}};
  const std::vector<double> rates = {1e8, 0.7e8};  // elements per second
  const size_t min = 1 << 20, tail = min / kTailClaimSpread;
  const double startup = 200e-6;
  auto gap = [&](size_t tail_claim) {
    ShareBalancer b(plan, min, 1024, min / kMinClaimSpread, tail_claim);
    const std::vector<double> end = run_clocked(b, rates, startup, 64 << 20);
    return std::abs(end[0] - end[1]);
  };
  const double with_tail = gap(tail), without = gap(0);
  const double one_tail_range = startup + static_cast<double>(tail) / rates[1];
  EXPECT_LE(with_tail, 2 * one_tail_range);
  EXPECT_LT(with_tail, without);
}

TEST(ShareBalancerTest, TheLeadersMinimumRangeAmortizesTheLargestSharesBulkStartUp) {
  const std::vector<multirail::RailShare> plan = {{0, 0, 1000}, {1, 1000, 4000}};
  multirail::RailEstimate slow{50, 1, 10}, fast{20, 10, 10};
  // No bulk start-up measured: the agreed minimum stands.
  EXPECT_EQ(leader_min_range_bytes(plan, {slow, fast}, 1 << 20), size_t{1} << 20);
  // Rail 1 carries the largest share; its ring start-up of 2 ms at 10 Gbit/s is worth
  // amortized_range_bytes = 8 x 2e-3 s x 1.25e9 B/s = 20 MB per range. Rail 0's does not count.
  fast.bulk_alpha_us = 2000;
  slow.bulk_alpha_us = 1e6;
  EXPECT_EQ(leader_min_range_bytes(plan, {slow, fast}, 1 << 20), size_t{20000000});
  EXPECT_EQ(leader_min_range_bytes(plan, {slow, fast}, 32 << 20), size_t{32} << 20);  // never lowered
  EXPECT_EQ(leader_min_range_bytes(plan, {slow}, 1 << 20), size_t{1} << 20);  // no estimate for rail 1
  // With that minimum a 4000-element share runs as one range, not halving ones.
  ShareBalancer b(plan, 4000, 10);
  auto got = claim_all(b, {0, 1});
  expect_exact_cover(got, 5000);
  EXPECT_EQ(got[1].size(), 1u);
}

TEST(ShareBalancerTest, AFastRailTakesTheBackOfTheSlowRailsShare) {
  ShareBalancer b({{0, 0, 4096}, {1, 4096, 4096}}, 256, 64);
  // Rail 1 takes its first range, then stalls; rail 0 drains its share and comes back for more.
  Range slow_first = b.claim(1);
  EXPECT_EQ(slow_first.offset, 4096u);
  EXPECT_EQ(slow_first.count, 2048u);
  std::vector<Range> fast;
  for (Range r = b.claim(0); r.count; r = b.claim(0)) fast.push_back(r);
  size_t fast_total = 0, stolen = 0;
  for (const Range& r : fast) {
    fast_total += r.count;
    if (r.offset >= 4096) {
      stolen += r.count;
      EXPECT_EQ(r.offset % 64, 0u) << "stolen range starts aligned";
    }
  }
  // Everything rail 1 had not started went to rail 0, back half first.
  EXPECT_EQ(stolen, 2048u);
  EXPECT_EQ(fast_total, 4096u + 2048u);
  EXPECT_EQ(b.claim(1).count, 0u);
  std::vector<std::vector<Range>> got = {fast, {slow_first}};
  expect_exact_cover(got, 8192);
}

// Shares 4:1 (the planner's split for rails of 4:1 rates): the slow rail's minimum range is a
// quarter of the fast one's, so a last range lasts about as long on either rail.
TEST(ShareBalancerTest, ASlowerRailsMinimumRangeShrinksWithItsShare) {
  ShareBalancer b({{0, 0, 8000}, {1, 8000, 2000}}, 400, 1, 50);
  auto got = claim_all(b, {0, 1});
  expect_exact_cover(got, 10000);
  const std::vector<size_t> want0 = {4000, 2000, 1000, 500, 500}, want1 = {1000, 500, 250, 125, 125};
  ASSERT_EQ(got[0].size(), want0.size());
  ASSERT_EQ(got[1].size(), want1.size());
  for (size_t i = 0; i < want0.size(); ++i) EXPECT_EQ(got[0][i].count, want0[i]) << i;
  for (size_t i = 0; i < want1.size(); ++i) EXPECT_EQ(got[1][i].count, want1[i]) << i;
  // The floor holds however small a share is: 1/1000 of the largest share, minimum 50, not 0.4.
  ShareBalancer tiny({{0, 0, 100000}, {1, 100000, 100}}, 400, 1, 50);
  EXPECT_EQ(tiny.claim(1).count, 50u);
}

// A rail that steals takes the part it would carry while the victim's rail carries the rest, at
// the planned rates: 4/5 of what is left for the fast rail, 1/5 for the slow one.
TEST(ShareBalancerTest, AStolenRangeFollowsThePlannedRatesOfThiefAndVictim) {
  {
    ShareBalancer b({{0, 0, 8000}, {1, 8000, 2000}}, 400, 1, 50);
    EXPECT_EQ(b.claim(1).count, 1000u);  // the slow rail starts, then stalls
    while (b.claim(0).offset < 8000) {
    }
    // That last claim was the fast rail's first steal: 800 of the 1000 left, from the back.
    const auto stolen = b.claimed(0).back();
    EXPECT_EQ(stolen.offset, 9200u);
    EXPECT_EQ(stolen.count, 800u);
    EXPECT_EQ(b.claim(1).count, 100u);  // the slow rail goes on at the front of what it kept
  }
  {
    ShareBalancer b({{0, 0, 8000}, {1, 8000, 2000}}, 400, 1, 50);
    EXPECT_EQ(b.claim(0).count, 4000u);  // the fast rail starts, then stalls
    while (b.claim(1).offset >= 8000) {
    }
    const auto stolen = b.claimed(1).back();
    EXPECT_EQ(stolen.offset, 7200u);
    EXPECT_EQ(stolen.count, 800u);  // a fifth of the 4000 left
  }
}

// Once both rails have finished ranges, a steal follows their rates in this operation, not the
// plan's: here the plan said 4:1 and the rails ran 8:1.
TEST(ShareBalancerTest, AStealFollowsTheRatesMeasuredInTheOperation) {
  ShareBalancer b({{0, 0, 40000}, {1, 40000, 10000}}, 400, 1, 50);
  const auto t0 = std::chrono::steady_clock::now();
  auto at = [&](double s) { return t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(s)); };
  EXPECT_EQ(b.claim(1, at(0)).count, 5000u);  // the slow rail: 2500 elements/s
  // The fast rail, 20000 elements/s: each claim when its last range ended; its share ends at 2 s.
  size_t done = 0;
  for (Range r = b.claim(0, at(0)); r.offset < 40000; r = b.claim(0, at(done / 20000.0))) done += r.count;
  ASSERT_EQ(done, 40000u);
  EXPECT_EQ(b.claimed(0).back().count, 4000u);
  // (That last claim, at 2 s, found the slow rail with no finished range: the plan's 4:1 gave it
  // 4/5 of the slow rail's 5000 left.) Start over with the slow rail measured before the steal.
  ShareBalancer c({{0, 0, 40000}, {1, 40000, 10000}}, 400, 1, 50);
  EXPECT_EQ(c.claim(1, at(0)).count, 5000u);
  done = 0;
  for (Range r = c.claim(0, at(0)); done + r.count < 40000; r = c.claim(0, at(done / 20000.0))) done += r.count;
  EXPECT_EQ(c.claim(1, at(2)).count, 2500u);  // 5000 elements in 2 s; 2500 left behind it
  const Range stolen = c.claim(0, at(2));     // 40000 elements in 2 s: 8 x the slow rail
  EXPECT_EQ(stolen.count, 2222u) << "8/9 of the 2500 left (the plan's 4/5 would be 2000)";
  EXPECT_EQ(stolen.offset, 50000u - 2222u);
}

// A thief 20x faster than its victim would take 20/21 of what is left; it leaves the victim at
// least the victim's minimum range instead (an alltoall's pieces below it would go unpaced: TSan's
// slow run of BalancedStripedAlltoall caught 12 such pieces).
TEST(ShareBalancerTest, AStealLeavesTheVictimAtLeastItsMinimumRange) {
  const auto t0 = std::chrono::steady_clock::now();
  auto at = [&](double s) { return t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(s)); };
  ShareBalancer c({{0, 0, 10000}, {1, 10000, 10000}}, 1000, 1, 1000);
  EXPECT_EQ(c.claim(1, at(0)).count, 5000u);
  for (double t : {0.0, 0.05, 0.075, 0.0875}) ASSERT_GT(c.claim(0, at(t)).count, 0u);
  ASSERT_EQ(c.claimed(0).size(), 4u);
  EXPECT_EQ(c.claim(1, at(1.0)).count, 2500u);  // 5000 elements/s; 2500 left behind it
  const Range stolen = c.claim(0, at(0.1));     // 100000 elements/s: it would take 2380
  EXPECT_EQ(stolen.count, 1500u) << "the victim keeps its minimum of 1000";
  EXPECT_EQ(c.claim(1, at(1.5)).count, 1000u);
  EXPECT_EQ(c.claim(1, at(1.7)).count, 0u);
  EXPECT_EQ(c.claim(0, at(0.2)).count, 0u);
}

TEST(ShareBalancerTest, ThreeUnequalSharesAndUnalignedSizesAreCoveredExactlyOnce) {
  ShareBalancer b({{0, 0, 777}, {1, 777, 5003}, {2, 5780, 1}}, 50, 16);
  auto got = claim_all(b, {2, 0, 2, 1});
  expect_exact_cover(got, 5781);
  for (size_t p = 0; p < 3; ++p) {
    auto record = b.claimed(p);
    ASSERT_EQ(record.size(), got[p].size());
    for (size_t i = 0; i < record.size(); ++i) EXPECT_EQ(record[i].offset, got[p][i].offset);
  }
}

TEST(ShareBalancerTest, ConcurrentRailsNeverGetTheSameElement) {
  ShareBalancer b({{0, 0, 100000}, {1, 100000, 50000}, {2, 150000, 80000}}, 64, 8);
  std::vector<std::vector<Range>> got(3);
  std::vector<std::thread> rails;
  for (size_t p = 0; p < 3; ++p)
    rails.emplace_back([&, p] {
      for (Range r = b.claim(p); r.count; r = b.claim(p)) got[p].push_back(r);
    });
  for (auto& t : rails) t.join();
  expect_exact_cover(got, 230000);
}

TEST(ShareBalancerTest, EmptySharesAndAMinimumAboveTheShareAreServed) {
  ShareBalancer b({{0, 0, 0}, {1, 0, 30}}, 1000, 4096);
  Range r = b.claim(0);  // its own share is empty: it takes the other's (all of it: under 2 minimums)
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(r.count, 30u);
  EXPECT_EQ(b.claim(1).count, 0u);
  EXPECT_EQ(b.claim(0).count, 0u);
}

}  // namespace
}  // namespace nezha::engine
