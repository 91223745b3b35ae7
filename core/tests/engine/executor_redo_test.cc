// Executor::redo when a redo's own rail fails too: every rank must create the same records on the
// target rail, or the rail's operation numbers shift apart and later collectives mismatch (a 16-rank
// alltoall on the testbed died so). Three ranks, three in-memory rails, driven directly (the engine
// would decide the same redos through rank 0).
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../collectives/memory_rail.h"
#include "engine/execution/executor.h"

namespace nezha::engine {
namespace {

constexpr int kRanks = 3;
constexpr size_t kCount = 1 << 20;  // float32: 2 MiB per share, so the broadcast goes down the chain 0 -> 1 -> 2

class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(ExecutorRedo, AShareRedoneIntoScratchIsRedoneAgainWhenItsRailFailsToo) {
  std::vector<std::unique_ptr<testing::MemoryWorld>> worlds;
  for (int w = 0; w < 3; ++w) worlds.push_back(std::make_unique<testing::MemoryWorld>(kRanks, "m" + std::to_string(w)));
  std::mutex errors_mu;
  std::vector<int> lost_on_rail1(kRanks, 0);
  std::vector<std::unique_ptr<Executor>> ex;
  for (int r = 0; r < kRanks; ++r) {
    ExecutorOptions o;
    o.rank = r;
    o.size = kRanks;
    o.timeout_s = 5;
    o.failover = true;
    o.stall_s = 30;  // the gate below holds rail 0: no stall report wanted
    // The planned split: a balanced broadcast's leader sends each range to every rank, so rank 0
    // would lose its rail-1 share too and the scenario below (rank 0 done, then redone into scratch)
    // would not arise.
    o.balance_bytes = 0;
    ExecutorHooks hooks;
    hooks.on_rail_error = [&, r](int rail, const std::string&, bool stalled, uint64_t) {
      std::lock_guard<std::mutex> lock(errors_mu);
      if (rail == 1 && !stalled) ++lost_on_rail1[r];
    };
    ex.push_back(std::make_unique<Executor>(o, std::vector<transport::Rail*>{&worlds[0]->rail(r), &worlds[1]->rail(r),
                                                                            &worlds[2]->rail(r)},
                                            nullptr, ShareObserver{}, hooks));
  }
  // A broadcast from rank 0 striped over rails 0 and 1; rail 1 is broken on rank 2, so rank 0 (which
  // only sends, to rank 1) completes it while ranks 1 and 2 lose their rail-1 share.
  worlds[1]->rail(2).abort("injected NIC error");
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(kCount, -1.0f));
  for (size_t i = 0; i < kCount; ++i) data[0][i] = static_cast<float>(i % 1000);
  std::vector<std::shared_ptr<OpHandle>> h(kRanks);
  Response resp;
  resp.kind = Response::Kind::kExecute;
  resp.type = OpType::kBroadcast;
  resp.names = {"b"};
  resp.counts = {static_cast<int64_t>(kCount)};
  resp.dtype = DataType::kFloat32;
  resp.root = 0;
  resp.plan = {{0, 0, kCount / 2}, {1, kCount / 2, kCount - kCount / 2}};
  for (int r = 0; r < kRanks; ++r) {
    TensorEntry e;
    e.req.type = OpType::kBroadcast;
    e.req.name = "b";
    e.req.dtype = DataType::kFloat32;
    e.req.shape = {static_cast<int64_t>(kCount)};
    e.req.root = 0;
    e.input = data[r].data();
    e.output = data[r].data();
    e.handle = h[r] = std::make_shared<OpHandle>();
    std::vector<TensorEntry> entries;
    entries.push_back(std::move(e));
    ex[r]->execute(resp, std::move(entries));
  }
  ASSERT_TRUE(h[0]->wait_for(10)) << "the root did not complete its broadcast";
  ASSERT_EQ(h[0]->error(), "");
  auto both_lost = [&] {
    std::lock_guard<std::mutex> lock(errors_mu);
    return lost_on_rail1[1] > 0 && lost_on_rail1[2] > 0;
  };
  for (int attempt = 0; attempt < 1000 && !both_lost(); ++attempt)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(both_lost()) << "ranks 1 and 2 did not lose their rail-1 share";

  // Rail 1's share is redone on rail 0 (rank 0: into scratch, its job is over), but rail 0 is held
  // so the redo is still queued when rail 0 fails too and everything from it is redone on rail 2
  // (redo() logs that the held rail was not drained: expected here).
  Gate gate;
  for (int r = 0; r < kRanks; ++r) ex[r]->post_task(0, [&] { gate.wait(); });
  for (int r = 0; r < kRanks; ++r) ex[r]->redo(/*rail=*/1, /*first=*/0, /*target=*/0);
  for (int r = 0; r < kRanks; ++r) ex[r]->redo(/*rail=*/0, /*first=*/1, /*target=*/2);
  // Rank 0 must take part on rail 2 (from its kept copy), or ranks 1 and 2 wait for it in vain.
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_TRUE(h[r]->wait_for(10)) << "rank " << r << ": the redo on rail 2 never completed";
    if (!h[r]->poll()) continue;
    EXPECT_EQ(h[r]->error(), "") << "rank " << r;
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(data[r][i], static_cast<float>(i % 1000)) << "rank " << r << " [" << i << "]";
  }
  // The stale copies queued on rail 0 fail on the aborted rail once released.
  for (int r = 0; r < kRanks; ++r) worlds[0]->rail(r).abort("rail 0 failed");
  gate.open();
  for (auto& e : ex) e->stop();
}

TEST(ExecutorRedo, ASkippedShareBehindALostOneLeavesCompletedAtTheLostOne) {
  // Rank 1 of 2 loses an allreduce share on rail 1 (aborted here), then skips another process set's
  // operation on the same rail. completed() must stay at the lost share: the redo every rank agrees
  // on starts at the lowest completed() reported, and a skipped share counted as done moved it
  // past the lost one, which was then never redone (its allreduce never finished).
  testing::MemoryWorld rail0(2, "s0"), rail1(2, "s1");
  std::promise<void> lost;
  ExecutorOptions o;
  o.rank = 1;
  o.size = 2;
  o.timeout_s = 5;
  o.failover = true;
  ExecutorHooks hooks;
  hooks.on_rail_error = [&](int rail, const std::string&, bool stalled, uint64_t) {
    if (rail == 1 && !stalled) lost.set_value();
  };
  Executor ex(o, {&rail0.rail(1), &rail1.rail(1)}, nullptr, ShareObserver{}, hooks);
  rail1.rail(1).abort("injected NIC error");

  std::vector<float> data(1024, 1.0f);
  Response all;
  all.kind = Response::Kind::kExecute;
  all.type = OpType::kAllreduce;
  all.names = {"a"};
  all.counts = {1024};
  all.plan = {{1, 0, 1024}};
  TensorEntry e;
  e.req.name = "a";
  e.req.shape = {1024};
  e.input = e.output = data.data();
  e.handle = std::make_shared<OpHandle>();
  std::vector<TensorEntry> entries;
  entries.push_back(std::move(e));
  ex.execute(all, std::move(entries));
  ASSERT_EQ(lost.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);

  Response other = all;  // another set's operation on rail 1: this rank skips it
  other.names = {"b@process_set_1"};
  other.process_set = 1;
  ex.skip(other);
  std::promise<void> behind;
  ex.post_task(1, [&] { behind.set_value(); });
  ASSERT_EQ(behind.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(ex.completed()[1], 0u) << "completed() passed the lost share (seq 0)";
  ex.stop();
}

}  // namespace
}  // namespace nezha::engine
