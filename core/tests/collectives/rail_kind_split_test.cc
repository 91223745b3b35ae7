// The rail contract's two kinds as the compiler and the allreduce see them: the algorithms take only
// a point-to-point rail, so a collective rail (no data calls to peers) cannot be handed to them;
// allreduce() on a collective rail hands the share to the rail, copying an out-of-place input first
// and scaling after, and refuses a dtype/op or size the rail does not take, naming the rail.
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "common/error.h"
#include "rank_harness.h"
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

// Whether broadcast() (like every algorithm but a collective rail's allreduce) accepts a rail of type R.
template <class R, class = void>
struct BroadcastAccepts : std::false_type {};
template <class R>
struct BroadcastAccepts<R, std::void_t<decltype(broadcast(std::declval<R&>(), nullptr, size_t{0}, 0,
                                                          std::declval<const CollectiveOptions&>()))>>
    : std::true_type {};

// Whether a rail of type R has a send() to a peer at all.
template <class R, class = void>
struct HasSend : std::false_type {};
template <class R>
struct HasSend<R, std::void_t<decltype(std::declval<R&>().send(0, 0, nullptr, 0, std::declval<const Deadline&>()))>>
    : std::true_type {};

static_assert(BroadcastAccepts<transport::TcpRail>::value && BroadcastAccepts<transport::ShmRail>::value &&
                  BroadcastAccepts<transport::GroupRail>::value && BroadcastAccepts<transport::HierarchicalRail>::value,
              "every point-to-point rail runs the algorithms");
static_assert(!BroadcastAccepts<transport::AggRail>::value && !BroadcastAccepts<transport::ShmCollRail>::value,
              "a collective rail cannot be handed to an algorithm that sends");
static_assert(!BroadcastAccepts<Rail>::value, "the engine must ask a rail its kind before running an algorithm");
static_assert(!HasSend<transport::AggRail>::value && !HasSend<transport::ShmCollRail>::value && !HasSend<Rail>::value,
              "no rail has a data call it can only refuse");
static_assert(!std::is_base_of_v<CollectiveRail, transport::TcpRail> &&
                  !std::is_base_of_v<PointToPointRail, transport::AggRail>,
              "a rail is of one kind");

// The ranks' meeting point for one float32 sum: each rank deposits its input, and once all have,
// each reads the sum in rank order (the same bits on every rank).
class SharedSum {
 public:
  explicit SharedSum(int size) : inputs_(static_cast<size_t>(size)) {}
  void deposit(int rank, const float* in, size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    inputs_[static_cast<size_t>(rank)].assign(in, in + count);
    if (++arrived_ == inputs_.size()) cv_.notify_all();
  }
  // False if not every rank arrived within the deadline.
  bool sum_into(float* out, size_t count, const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return arrived_ == inputs_.size(); })) return false;
    for (size_t i = 0; i < count; ++i) {
      float acc = inputs_[0][i];
      for (size_t r = 1; r < inputs_.size(); ++r) acc += inputs_[r][i];
      out[i] = acc;
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<float>> inputs_;
  size_t arrived_ = 0;
};

// A collective rail of ranks as threads: it reduces float32 Sum (and Average, scaled by the caller)
// through a SharedSum, announcing the whole output to before_overwrite before writing it.
class ThreadSumRail final : public CollectiveRail {
 public:
  ThreadSumRail(SharedSum& sum, int rank, int size, size_t max_share_bytes)
      : sum_(sum), rank_(rank), size_(size) {
    props_.name = "threadsum";
    props_.kind = "threadsum";
    props_.max_share_bytes = max_share_bytes;
  }
  const transport::RailProperties& properties() const override { return props_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string local_address() const override { return {}; }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  transport::RailCounters counters() const override { return {}; }
  void abort(const std::string&) override {}

  bool reduces(DataType dtype, ReduceOp op) const override {
    return dtype == DataType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
  }
  std::unique_ptr<transport::CollectiveRequest> start_allreduce(const void* input, void* output, size_t count,
                                                                 DataType, ReduceOp, uint64_t,
                                                                 OverwriteHook before_overwrite) override {
    sum_.deposit(rank_, static_cast<const float*>(input), count);
    return std::make_unique<Request>(sum_, static_cast<float*>(output), count, std::move(before_overwrite));
  }

 private:
  class Request : public transport::CollectiveRequest {
   public:
    Request(SharedSum& sum, float* out, size_t count, OverwriteHook hook)
        : sum_(sum), out_(out), count_(count), hook_(std::move(hook)) {}
    bool test() override { return false; }
    void wait(const Deadline& deadline) override {
      if (hook_) hook_(0, count_ * sizeof(float));
      if (!sum_.sum_into(out_, count_, deadline)) throw TimeoutError(-1, "threadsum: a rank never arrived");
    }

   private:
    SharedSum& sum_;
    float* out_;
    size_t count_;
    OverwriteHook hook_;
  };

  SharedSum& sum_;
  const int rank_, size_;
  transport::RailProperties props_;
};

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

}  // namespace
}  // namespace nezha::collectives
