// CompletionQueue fed by OpHandle::on_done (what the bindings' OpHandle.notify does): tokens arrive
// in completion order whatever the order of submission, an operation done before it is watched is
// announced at once, and close() wakes a waiting consumer.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "engine/completion_queue.h"
#include "engine/handle.h"

namespace nezha::engine {
namespace {

void notify(OpHandle& h, const std::shared_ptr<CompletionQueue>& q, uint64_t token) {
  h.on_done([q, token] { q->push(token); });
}

TEST(CompletionQueue, TokensArriveInCompletionOrder) {
  auto q = std::make_shared<CompletionQueue>();
  OpHandle first, second, third;
  notify(first, q, 1);
  notify(second, q, 2);
  notify(third, q, 3);
  EXPECT_TRUE(q->pop(0.01).empty());
  third.complete();
  first.complete("failed");
  EXPECT_EQ(q->pop(1), (std::vector<uint64_t>{3, 1}));
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    second.complete();
  });
  EXPECT_EQ(q->pop(10), (std::vector<uint64_t>{2}));
  later.join();
  second.complete();  // completing twice announces nothing more
  EXPECT_TRUE(q->pop(0.01).empty());
}

TEST(CompletionQueue, AnOperationDoneBeforeItIsWatchedIsAnnouncedAtOnce) {
  auto q = std::make_shared<CompletionQueue>();
  OpHandle done;
  done.complete();
  notify(done, q, 7);
  EXPECT_EQ(q->pop(0), (std::vector<uint64_t>{7}));
}

TEST(CompletionQueue, CloseWakesAWaitingConsumer) {
  auto q = std::make_shared<CompletionQueue>();
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    q->close();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(q->pop(30).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  closer.join();
  EXPECT_TRUE(q->pop(30).empty());  // closed: at once
}

}  // namespace
}  // namespace nezha::engine
