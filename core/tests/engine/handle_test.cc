// OpHandle::on_done: callers that must not block a thread on wait_for (TensorFlow's async kernels)
// are told once, after the result and error are readable, whichever comes first: completion or
// registration.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "engine/handle.h"

namespace nezha::engine {
namespace {

TEST(OpHandleOnDone, RunsOnceOnTheCompletingThreadAfterTheResultIsReadable) {
  OpHandle h;
  std::vector<std::string> seen;
  std::thread::id ran_on;
  h.on_done([&] {
    seen.push_back(h.error());
    ran_on = std::this_thread::get_id();
  });
  EXPECT_TRUE(seen.empty());
  std::thread completer([&] {
    h.result().last_joined_rank = 3;
    h.complete("peer 1 died");
    h.complete("again");  // a second completion is ignored, and so are its callbacks
  });
  const std::thread::id completer_id = completer.get_id();
  completer.join();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "peer 1 died");
  EXPECT_EQ(ran_on, completer_id);
  EXPECT_EQ(h.result().last_joined_rank, 3);
}

TEST(OpHandleOnDone, RunsAtOnceWhenAlreadyDone) {
  OpHandle h;
  h.complete();
  int calls = 0;
  h.on_done([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(OpHandleOnDone, EveryCallbackRunsExactlyOnceWhenRegistrationRacesCompletion) {
  for (int round = 0; round < 200; ++round) {
    OpHandle h;
    std::atomic<int> calls{0};
    std::thread registrar([&] {
      for (int i = 0; i < 8; ++i) h.on_done([&] { calls.fetch_add(1); });
    });
    std::thread completer([&] { h.complete(); });
    registrar.join();
    completer.join();
    ASSERT_EQ(calls.load(), 8) << "round " << round;
  }
}

}  // namespace
}  // namespace nezha::engine
