// RailWorker: jobs run in posting order on one thread; try_run_inline only when the worker is idle
// with nothing queued; stop() drains what was posted.
#include "engine/execution/rail_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nezha::engine {
namespace {

using namespace std::chrono_literals;

// Occupies the worker with a job that waits until open() (returns once the job is running).
class Blocker {
 public:
  explicit Blocker(RailWorker& w) {
    std::shared_future<void> gate = gate_.get_future().share();
    w.post([this, gate] {
      started_.set_value();
      gate.wait();
    });
    started_.get_future().wait();
  }
  void open() { gate_.set_value(); }

 private:
  std::promise<void> started_, gate_;
};

TEST(RailWorkerTest, JobsRunInPostingOrderOnOneThread) {
  RailWorker w;
  std::vector<int> order;  // written by the worker only
  std::mutex mu;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 1000; ++i)
    w.post([&, i] {
      order.push_back(i);
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    });
  w.stop();
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(RailWorkerTest, StopRunsJobsAlreadyPosted) {
  std::atomic<int> ran{0};
  {
    RailWorker w;
    Blocker blocker(w);
    for (int i = 0; i < 5; ++i) w.post([&] { ran++; });
    EXPECT_EQ(w.queued(), 5u);
    blocker.open();
    w.stop();
    EXPECT_EQ(ran.load(), 5);
    EXPECT_EQ(w.queued(), 0u);
  }
  EXPECT_EQ(ran.load(), 5);
}

TEST(RailWorkerTest, TryRunInlineRunsOnCallerWhenIdle) {
  RailWorker w;
  std::thread::id ran_on;
  EXPECT_TRUE(w.try_run_inline([&] { ran_on = std::this_thread::get_id(); }));
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // synchronous, on the calling thread
}

TEST(RailWorkerTest, TryRunInlineRefusesWhileAJobRuns) {
  RailWorker w;
  Blocker blocker(w);
  bool ran = false;
  EXPECT_FALSE(w.try_run_inline([&] { ran = true; }));
  EXPECT_FALSE(ran);
  blocker.open();
  w.stop();
  EXPECT_FALSE(ran);
}

TEST(RailWorkerTest, TryRunInlineRefusesWhileJobsAreQueued) {
  RailWorker w;
  std::vector<int> order;
  Blocker blocker(w);
  w.post([&] { order.push_back(1); });
  // Running it now would overtake job 1: a collective's messages would pair with the wrong peer op.
  EXPECT_FALSE(w.try_run_inline([&] { order.push_back(2); }));
  blocker.open();
  w.stop();
  EXPECT_EQ(order, std::vector<int>{1});
}

TEST(RailWorkerTest, PostedJobWaitsForInlineJobToFinish) {
  RailWorker w;
  std::vector<int> order;
  std::mutex mu;
  auto note = [&](int v) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(v);
  };
  ASSERT_TRUE(w.try_run_inline([&] {
    note(1);
    w.post([&] { note(3); });
    std::this_thread::sleep_for(50ms);  // the worker must not start job 3 meanwhile
    note(2);
  }));
  w.stop();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(RailWorkerTest, TryRunInlineRefusedAfterStop) {
  RailWorker w;
  w.stop();
  bool ran = false;
  EXPECT_FALSE(w.try_run_inline([&] { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST(RailWorkerTest, IdleWorkerRunsPostedJobPromptly) {
  RailWorker w;
  std::this_thread::sleep_for(20ms);  // let it go to sleep
  std::promise<void> done;
  auto f = done.get_future();
  auto start = std::chrono::steady_clock::now();
  w.post([&] { done.set_value(); });
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
}

TEST(RailWorkerTest, ThrowingInlineJobLeavesWorkerUsable) {
  // Was a bug (core/src/engine/rail_worker.cc, try_run_inline): busy_ is set before job() and cleared
  // after it with no guard, so a job that throws leaves busy_ == true forever. The worker thread
  // then never runs another job (its wait predicate needs !busy_), every later try_run_inline
  // refuses, and stop()/~RailWorker hang joining the thread. Executor's allreduce job catches
  // std::exception from the collective, but finish_allreduce, the share observer and anything
  // non-std can still throw. Fix: clear busy_ and notify in a scope guard (or catch(...), reset,
  // rethrow).
  auto* w = new RailWorker;
  EXPECT_THROW(w->try_run_inline([] { throw std::runtime_error("boom"); }), std::runtime_error);
  std::promise<void> done;
  auto f = done.get_future();
  w->post([&] { done.set_value(); });
  if (f.wait_for(2s) != std::future_status::ready) {
    ADD_FAILURE() << "worker never ran a job posted after a throwing inline job";
    return;  // leak w: its destructor would hang
  }
  delete w;
}

// Profiles (top -H, py-spy, /proc) tell the rail threads from the framework's by their name.
TEST(RailWorker, ItsThreadIsNamed) {
  RailWorker w;
  std::promise<std::string> name;
  auto f = name.get_future();
  w.post([&] {
    std::ifstream comm("/proc/thread-self/comm");
    std::string n;
    std::getline(comm, n);
    name.set_value(n);
  });
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(f.get(), "nz-rail");
}

}  // namespace
}  // namespace nezha::engine
