// TaskLedger (task_ledger.h) over tasks that only record what is done with them: which tasks a redo
// takes and in which order, the pass each redo runs as, what trim drops and what fail_all hands
// back. The executor's failover works on this and on the ShareTask interface alone.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/execution/share_task.h"
#include "engine/execution/task_ledger.h"

namespace nezha::engine {
namespace {

using State = ShareTask::State;
using Pass = ShareTask::Pass;

// A task the ledger holds; it never runs here.
class NamedTask final : public ShareTask {
 public:
  NamedTask(int rail, Pass pass, std::string name, size_t bytes = 0)
      : ShareTask(rail, pass), name(std::move(name)), bytes(bytes) {}
  void run(TaskContext&) override {}
  std::unique_ptr<ShareTask> redo_on(int, Pass, TaskContext&) override { return nullptr; }
  void abandon(TaskContext&) override {}
  size_t redo_bytes() const override { return bytes; }
  const std::string name;
  const size_t bytes;
};

std::shared_ptr<NamedTask> enter(TaskLedger& ledger, int rail, uint64_t seq, State state, const std::string& name,
                                 Pass pass = Pass::kFirst, size_t bytes = 0) {
  auto task = std::make_shared<NamedTask>(rail, pass, name, bytes);
  task->seq = seq;
  ledger.enter(task);
  ledger.set_state(*task, state);
  return task;
}

struct Redone {
  std::string name;
  Pass pass;
  uint64_t seq;
};

TEST(TaskLedger, AMoveRedoesEveryTaskFromTheFirstAgreedOnInOrderEachAsItsStateSays) {
  TaskLedger ledger(2, /*rank=*/0);
  enter(ledger, 0, 0, State::kDone, "kept");
  enter(ledger, 0, 1, State::kDone, "completed here");
  enter(ledger, 0, 2, State::kLost, "lost");
  enter(ledger, 0, 3, State::kLost, "lost behind it");
  enter(ledger, 0, 4, State::kLost, "redone for the others before", Pass::kRedoForOthers, 64);
  ASSERT_TRUE(ledger.mark_lost(*enter(ledger, 0, 5, State::kRunning, "lost running", Pass::kFirst, 32)));
  EXPECT_TRUE(ledger.has_lost(0));

  std::vector<Redone> redone;
  std::vector<std::string> posted;
  uint64_t next_seq = 10;  // the target rail's operation numbers
  const TaskLedger::Moved moved = ledger.move(
      0, /*first=*/1,
      [&](ShareTask& old, Pass pass) {
        const auto& named = static_cast<NamedTask&>(old);
        redone.push_back({named.name, pass, old.seq});
        auto task = std::make_shared<NamedTask>(1, pass, named.name, named.bytes);
        task->seq = next_seq++;
        return task;
      },
      [&](std::shared_ptr<ShareTask> task) { posted.push_back(static_cast<NamedTask&>(*task).name); });

  const std::vector<std::string> order = {"completed here", "lost", "lost behind it", "redone for the others before",
                                          "lost running"};
  ASSERT_EQ(redone.size(), order.size());
  const Pass passes[] = {Pass::kRedoForOthers, Pass::kRedo, Pass::kRedo, Pass::kRedoForOthers, Pass::kRedo};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(redone[i].name, order[i]);
    EXPECT_EQ(redone[i].seq, i + 1);
    EXPECT_EQ(redone[i].pass, passes[i]) << order[i];
  }
  EXPECT_EQ(posted, order);
  EXPECT_EQ(moved.taken, 5u);
  EXPECT_EQ(moved.redone, 5u);
  EXPECT_EQ(moved.bytes, 96u);
  EXPECT_EQ(ledger.size(0), 1u);  // "kept" stays until trimmed
  EXPECT_EQ(ledger.size(1), 5u);
  EXPECT_FALSE(ledger.has_lost(0)) << "no lost task is left on the rail";
}

TEST(TaskLedger, ATaskWithNothingToRedoIsNeitherEnteredNorPosted) {
  TaskLedger ledger(2, 0);
  enter(ledger, 0, 0, State::kLost, "ended without it");
  enter(ledger, 0, 1, State::kLost, "redone");
  std::vector<std::string> posted;
  const TaskLedger::Moved moved = ledger.move(
      0, 0,
      [&](ShareTask& old, Pass pass) -> std::shared_ptr<ShareTask> {
        const auto& named = static_cast<NamedTask&>(old);
        if (named.name == "ended without it") return nullptr;
        return std::make_shared<NamedTask>(1, pass, named.name);
      },
      [&](std::shared_ptr<ShareTask> task) { posted.push_back(static_cast<NamedTask&>(*task).name); });
  EXPECT_EQ(moved.taken, 2u);
  EXPECT_EQ(moved.redone, 1u);
  EXPECT_EQ(posted, std::vector<std::string>{"redone"});
  EXPECT_EQ(ledger.size(0), 0u);
  EXPECT_EQ(ledger.size(1), 1u);
}

TEST(TaskLedger, ALostTaskBelowTheMovedOnesKeepsItsRailMarkedLost) {
  TaskLedger ledger(2, 0);
  ASSERT_TRUE(ledger.mark_lost(*enter(ledger, 0, 0, State::kRunning, "lost, not agreed on yet")));
  enter(ledger, 0, 1, State::kLost, "moved");
  ledger.move(
      0, 1, [&](ShareTask&, Pass pass) { return std::make_shared<NamedTask>(1, pass, "moved"); },
      [](std::shared_ptr<ShareTask>) {});
  EXPECT_TRUE(ledger.has_lost(0));
  EXPECT_FALSE(ledger.has_lost(1));
}

TEST(TaskLedger, TrimDropsDoneTasksBelowTheWatermarkUpToTheFirstUnfinishedOne) {
  TaskLedger ledger(2, 0);
  auto t0 = enter(ledger, 0, 0, State::kDone, "a");
  enter(ledger, 0, 1, State::kDone, "b");
  enter(ledger, 0, 2, State::kRunning, "c");
  enter(ledger, 0, 3, State::kDone, "d");
  enter(ledger, 1, 0, State::kDone, "e");
  enter(ledger, 1, 1, State::kDone, "f");
  std::weak_ptr<NamedTask> dropped = t0;
  t0.reset();
  ledger.trim({4, 1});
  EXPECT_EQ(ledger.size(0), 2u) << "stops at the running task";
  EXPECT_EQ(ledger.size(1), 1u) << "rail 1's watermark is 1";
  EXPECT_TRUE(dropped.expired()) << "a trimmed task (and its kept input) is freed";
}

TEST(TaskLedger, FailAllHandsBackTheLostTasksThatWaitOnARedoAndEmptiesTheLedger) {
  TaskLedger ledger(2, 0);
  enter(ledger, 0, 0, State::kDone, "done");
  enter(ledger, 0, 1, State::kLost, "lost");
  enter(ledger, 1, 0, State::kLost, "lost, redone for the others", Pass::kRedoForOthers);
  enter(ledger, 1, 1, State::kQueued, "queued");
  enter(ledger, 1, 2, State::kLost, "lost too");
  std::vector<std::string> lost;
  for (auto& task : ledger.fail_all("first reason")) lost.push_back(static_cast<NamedTask&>(*task).name);
  EXPECT_EQ(lost, (std::vector<std::string>{"lost", "lost too"}));
  EXPECT_EQ(ledger.size(0), 0u);
  EXPECT_EQ(ledger.size(1), 0u);
  EXPECT_TRUE(ledger.failed());
  ledger.fail_all("second reason");
  EXPECT_EQ(ledger.reason(), "first reason");
  NamedTask late(0, Pass::kFirst, "late");
  EXPECT_FALSE(ledger.mark_lost(late)) << "after fail_all a failure is final";
  EXPECT_EQ(late.state, State::kQueued);
}

}  // namespace
}  // namespace nezha::engine
