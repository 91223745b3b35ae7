// The hierarchical allreduce's pieces on their own: the group view of a rail (GroupRail) and the
// slice ownership plan (hierarchy.h), including the uneven 3 + 1 placement.
#include <gtest/gtest.h>

#include <vector>

#include "collectives/hierarchy.h"
#include "common/error.h"
#include "rank_harness.h"
#include "transport/group_rail.h"

namespace nezha::collectives {
namespace {

transport::HostPlacement placement(std::vector<int> host_of_rank) { return {std::move(host_of_rank)}; }

TEST(HierarchyPlan, UnevenPlacementPutsTheLoneRankInEverySlicesGroup) {
  const auto p3 = plan_hierarchical(placement({0, 0, 0, 1}), 3, 3000, 4);
  EXPECT_EQ(p3.local_ranks, std::vector<int>({3}));
  EXPECT_EQ(p3.my_slices, std::vector<int>({0, 1, 2}));
  ASSERT_EQ(p3.group_of_slice.size(), 3u);
  EXPECT_EQ(p3.group_of_slice[0], std::vector<int>({0, 3}));
  EXPECT_EQ(p3.group_of_slice[1], std::vector<int>({1, 3}));
  EXPECT_EQ(p3.group_of_slice[2], std::vector<int>({2, 3}));
  EXPECT_EQ(p3.block_count, std::vector<size_t>({3000}));
  EXPECT_TRUE(p3.interleave);  // rank 3 serves three groups
  EXPECT_FALSE(plan_hierarchical(placement({0, 0, 1, 1}), 0, 3000, 4).interleave);

  const auto p1 = plan_hierarchical(placement({0, 0, 0, 1}), 1, 3000, 4);
  EXPECT_EQ(p1.local_ranks, std::vector<int>({0, 1, 2}));
  EXPECT_EQ(p1.local_index, 1);
  EXPECT_EQ(p1.my_slices, std::vector<int>({1}));
  // Slices cover the buffer in order; each local rank's block is its run of slices.
  EXPECT_EQ(p1.slice_offset.front(), 0u);
  EXPECT_EQ(p1.slice_offset.back(), 3000u);
  EXPECT_EQ(p1.block_offset[1], p1.slice_offset[1]);
  EXPECT_EQ(p1.block_count[1], p1.slice_offset[2] - p1.slice_offset[1]);
}

TEST(HierarchyPlan, HostsWithFewerRanksOwnContiguousRunsOfSlices) {
  // Hosts of 4, 2 and 1 ranks (interleaved ranks: hosts are numbered by their lowest rank).
  const transport::HostPlacement p = placement({0, 1, 0, 2, 0, 1, 0});
  const auto plan = plan_hierarchical(p, 1, 1 << 16, 4);  // rank 1: host 1 = ranks {1, 5}
  EXPECT_EQ(plan.local_ranks, std::vector<int>({1, 5}));
  EXPECT_EQ(plan.my_slices, std::vector<int>({0, 1}));
  ASSERT_EQ(plan.group_of_slice.size(), 4u);
  EXPECT_EQ(plan.group_of_slice[0], std::vector<int>({0, 1, 3}));
  EXPECT_EQ(plan.group_of_slice[2], std::vector<int>({4, 5, 3}));
  EXPECT_EQ(plan.block_count[0] + plan.block_count[1], size_t{1} << 16);
  // Every slice has exactly one owner per host.
  for (const auto& g : plan.group_of_slice) EXPECT_EQ(g.size(), 3u);
}

TEST(HierarchyPlan, MorePiecesThanElementsStillCoverEveryElementOnce) {
  const auto plan = plan_hierarchical(placement({0, 0, 0, 1}), 0, 2, 8);
  EXPECT_EQ(plan.slice_offset.back(), 2u);
  size_t covered = 0;
  for (size_t c : plan.block_count) covered += c;
  EXPECT_EQ(covered, 2u);
}

TEST(GroupRail, AllreduceAmongSomeRanksLeavesTheOthersAlone) {
  nezha::testing::run_ranks(4, [](transport::PointToPointRail& rail) {
    std::vector<float> v(1000, static_cast<float>(rail.rank() + 1));
    if (rail.rank() == 1 || rail.rank() == 3) {
      transport::GroupRail group(rail, {3, 1});  // group rank 0 is job rank 3
      EXPECT_EQ(group.size(), 2);
      EXPECT_EQ(group.rank(), rail.rank() == 3 ? 0 : 1);
      EXPECT_EQ(group.job_rank(0), 3);
      EXPECT_TRUE(group.reaches(1 - group.rank()));
      EXPECT_FALSE(group.reaches(group.rank()));
      allreduce(group, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, nezha::testing::test_options());
      for (float x : v) ASSERT_EQ(x, 2.0f + 4.0f);
    }
  });
}

TEST(GroupRail, RefusesAGroupWithoutThisRankOrWithRanksOutsideTheJob) {
  nezha::testing::run_ranks(2, [](transport::PointToPointRail& rail) {
    EXPECT_THROW(transport::GroupRail(rail, {1 - rail.rank()}), InvalidArgument);
    EXPECT_THROW(transport::GroupRail(rail, {0, 1, 2}), InvalidArgument);
    EXPECT_THROW(transport::GroupRail(rail, {rail.rank(), rail.rank()}), InvalidArgument);
    transport::GroupRail alone(rail, {rail.rank()});
    EXPECT_THROW(alone.send(1, 0, nullptr, 0, nezha::testing::test_deadline()), InvalidArgument);
  });
}

}  // namespace
}  // namespace nezha::collectives
