// The rail contract's two kinds as the compiler and the allreduce see them: the algorithms take only
// a point-to-point rail, so a collective rail (no data calls to peers) cannot be handed to them;
// allreduce() on a collective rail hands the share to the rail, copying an out-of-place input first
// and scaling after, and refuses a dtype/op or size the rail does not take, naming the rail; the
// other operations' collective-rail forms refuse a rail that does not run them, naming it.
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "common/error.h"
#include "rank_harness.h"
#include "thread_sum_rail.h"
#include "transport/agg/agg_rail.h"
#include "transport/group_rail.h"
#include "transport/hierarchical_rail.h"
#include "transport/shm/shm_rail.h"
#include "transport/shm_coll/shm_coll_rail.h"
#include "transport/tcp/tcp_rail.h"

namespace nezha::collectives {
namespace {

using transport::CollectiveRail;
using transport::PointToPointRail;
using transport::Rail;
using testing::SharedSum;
using testing::ThreadSumRail;

// Whether alltoallv() (like every algorithm that sends; a collective rail has forms only of the
// operations it may run itself) accepts a rail of type R.
template <class R, class = void>
struct AlgorithmAccepts : std::false_type {};
template <class R>
struct AlgorithmAccepts<R, std::void_t<decltype(alltoallv(std::declval<R&>(), nullptr,
                                                          std::declval<const std::vector<size_t>&>(), nullptr,
                                                          std::declval<const std::vector<size_t>&>(),
                                                          std::declval<const CollectiveOptions&>()))>>
    : std::true_type {};

// Whether a rail of type R has a send() to a peer at all.
template <class R, class = void>
struct HasSend : std::false_type {};
template <class R>
struct HasSend<R, std::void_t<decltype(std::declval<R&>().send(0, 0, nullptr, 0, std::declval<const Deadline&>()))>>
    : std::true_type {};

static_assert(AlgorithmAccepts<transport::TcpRail>::value && AlgorithmAccepts<transport::ShmRail>::value &&
                  AlgorithmAccepts<transport::GroupRail>::value && AlgorithmAccepts<transport::HierarchicalRail>::value,
              "every point-to-point rail runs the algorithms");
static_assert(!AlgorithmAccepts<transport::AggRail>::value && !AlgorithmAccepts<transport::ShmCollRail>::value,
              "a collective rail cannot be handed to an algorithm that sends");
static_assert(!AlgorithmAccepts<Rail>::value, "the engine must ask a rail its kind before running an algorithm");
static_assert(!HasSend<transport::AggRail>::value && !HasSend<transport::ShmCollRail>::value && !HasSend<Rail>::value,
              "no rail has a data call it can only refuse");
static_assert(!std::is_base_of_v<CollectiveRail, transport::TcpRail> &&
                  !std::is_base_of_v<PointToPointRail, transport::AggRail>,
              "a rail is of one kind");

constexpr int kRanks = 4;
constexpr size_t kCount = 1000;

float input_value(int rank, size_t i) { return static_cast<float>(rank * 3 + static_cast<int>(i % 17)); }

TEST(CollectiveRailAllreduce, OutOfPlaceCopiesTheInputLeavesItUntouchedAndScalesTheSum) {
  SharedSum sum(kRanks);
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(kCount)), out = in;
  std::vector<size_t> announced(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      for (size_t i = 0; i < kCount; ++i) in[r][i] = input_value(r, i);
      ThreadSumRail rail(sum, r, kRanks, 0);
      CollectiveOptions opt = testing::test_options();
      opt.postscale = 0.25;  // an Average over four ranks; exact for these integers
      opt.before_overwrite = [&, r](size_t offset, size_t bytes) { announced[r] += offset == 0 ? bytes : 0; };
      try {
        allreduce(rail, in[r].data(), out[r].data(), kCount, DataType::kFloat32, ReduceOp::kAverage, opt);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(announced[r], kCount * sizeof(float)) << "rank " << r;
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(in[r][i], input_value(r, i)) << "rank " << r << " wrote its input at " << i;
      double expected = 0;
      for (int p = 0; p < kRanks; ++p) expected += input_value(p, i);
      ASSERT_EQ(out[r][i], static_cast<float>(expected / kRanks)) << "rank " << r << ", element " << i;
    }
  }
}

TEST(CollectiveRailAllreduce, WhatTheRailDoesNotTakeIsRefusedNamingIt) {
  SharedSum sum(1);
  ThreadSumRail capped(sum, 0, 1, 64);  // takes float32 Sum up to 64 bytes
  std::vector<int32_t> ints(4, 1);
  std::vector<float> floats(32, 1.0f);
  for (auto attempt : {std::function<void()>([&] {
                         allreduce(capped, ints.data(), ints.data(), ints.size(), DataType::kInt32, ReduceOp::kSum,
                                   testing::test_options());
                       }),
                       std::function<void()>([&] {
                         allreduce(capped, floats.data(), floats.data(), floats.size(), DataType::kFloat32,
                                   ReduceOp::kSum, testing::test_options());
                       })}) {
    try {
      attempt();
      FAIL() << "the collective rail ran an allreduce it does not take";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rail 'threadsum'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(floats[0], 1.0f);  // refused before anything was written
  // Within the cap it runs (one rank: the sum is the input).
  allreduce(capped, floats.data(), floats.data(), 16, DataType::kFloat32, ReduceOp::kSum, testing::test_options());
  EXPECT_EQ(floats[0], 1.0f);
}

TEST(CollectiveRailOperations, AnOperationTheRailDoesNotRunIsRefusedNamingIt) {
  SharedSum sum(1);
  ThreadSumRail rail(sum, 0, 1, 0);  // allreduces only, as the base contract says
  std::vector<uint8_t> buf(16, 7), out(16);
  for (auto attempt : {std::function<void()>([&] { broadcast(rail, buf.data(), buf.size(), 0, testing::test_options()); }),
                       std::function<void()>([&] { allgatherv(rail, buf.data(), out.data(), {16}, testing::test_options()); }),
                       std::function<void()>([&] {
                         reducescatterv_blocks(rail, {buf.data()}, {out.data()}, {4}, DataType::kFloat32, ReduceOp::kSum,
                                               testing::test_options());
                       })}) {
    try {
      attempt();
      FAIL() << "a collective rail ran an operation it does not run";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rail 'threadsum' cannot run a"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(out, std::vector<uint8_t>(16, 0));
}

}  // namespace
}  // namespace nezha::collectives
