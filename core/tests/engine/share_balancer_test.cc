// ShareBalancer: which ranges each rail of a balanced allreduce is handed, on the leader.
#include "engine/execution/share_balancer.h"

#include <gtest/gtest.h>

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
