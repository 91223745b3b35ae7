// TaskLedger: with failover on, every task (share_task.h) posted to a rail, kept from when it is
// posted until every rank has completed it (the watermark rank 0 sends), with its state. A task
// lost with its rail is moved from here to a surviving rail as the task its redo_on() makes; when
// the job cannot go on, the lost ones are handed back to be failed. Thread-safe: the engine thread
// enters, moves and trims; rail workers change their task's state.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/execution/share_task.h"

namespace nezha::engine {

class TaskLedger {
 public:
  // `rank`: this rank, for messages.
  TaskLedger(size_t rails, int rank);

  // Appends `task` to its rail's ledger (tasks are entered in seq order).
  void enter(std::shared_ptr<ShareTask> task);
  void set_state(ShareTask& task, ShareTask::State state);
  // Marks `task` lost, and its rail as holding a lost task; false (nothing marked) once fail_all()
  // was called.
  bool mark_lost(ShareTask& task);
  // Whether a task was lost on `rail` and no move() has taken it yet.
  bool has_lost(int rail) const { return lost_[rail]; }

  // What move() did: tasks taken off the rail, tasks redone (entered on the target), and the
  // input bytes those redos start from.
  struct Moved {
    size_t taken = 0, redone = 0, bytes = 0;
  };
  // Takes every task of `rail` with seq >= first and, in seq order, enters on its new rail the task
  // `redo(old, pass)` makes (null: nothing to redo) and hands it to `post`, outside the lock. The
  // pass is kRedoForOthers for a task this rank had completed (or redone for the others already),
  // else kRedo. `redo` runs under the lock; the rail must be drained (a task still queued or
  // running there is logged as an error).
  using Redo = std::function<std::shared_ptr<ShareTask>(ShareTask& old, ShareTask::Pass pass)>;
  Moved move(int rail, uint64_t first, const Redo& redo, const std::function<void(std::shared_ptr<ShareTask>)>& post);
  // Drops the done tasks below each rail's watermark (their kept inputs with them).
  void trim(const std::vector<uint64_t>& watermark);
  // The job cannot go on: records `reason` (the first one given), empties every ledger and returns
  // the lost tasks that wait for a redo that will not come (those redone for the others excepted:
  // nothing waits on them).
  std::vector<std::shared_ptr<ShareTask>> fail_all(const std::string& reason);
  bool failed() const { return failed_; }
  std::string reason() const;  // fail_all's; "" before

  // Tasks held for `rail` (tests).
  size_t size(int rail) const;

 private:
  const int rank_;
  mutable std::mutex mu_;
  std::vector<std::deque<std::shared_ptr<ShareTask>>> ledger_;  // per rail, in seq order
  std::unique_ptr<std::atomic<bool>[]> lost_;  // per rail: has_lost()
  std::atomic<bool> failed_{false};
  std::string reason_;  // guarded by mu_; set once, with failed_
};

}  // namespace nezha::engine
