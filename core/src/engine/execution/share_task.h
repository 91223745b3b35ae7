// ShareTask: one piece of work a rail's worker runs for the executor (executor.h), and what
// failover does with it. Five kinds (task_kinds.h): a share of an allreduce, a share of a balanced
// allreduce (the ranges its rail is handed), a part of a striped broadcast, allgather, alltoall or
// reducescatter, a collective run whole on one rail, and another process set's operation this rank
// skips. Each owns what it needs to run, keeps its input for a redo while it runs (with failover
// on), and makes the task that redoes it on another rail from that input. The ledger and the
// failover code (executor_failover.cc) see only this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace nezha::engine {

class TaskContext;  // task_context.h

class ShareTask {
 public:
  enum class State { kQueued, kRunning, kDone, kLost };
  // How a task runs: the first time; again after its rail failed (from its kept input); or again
  // for the other ranks by a rank that had completed it, into scratch memory so that what it
  // delivered is not touched.
  enum class Pass { kFirst, kRedo, kRedoForOthers };

  ShareTask(int rail, Pass pass) : rail_(rail), pass_(pass) {}
  virtual ~ShareTask() = default;
  ShareTask(const ShareTask&) = delete;
  ShareTask& operator=(const ShareTask&) = delete;

  // On the rail's worker, in seq order: runs the task and completes its part of the operation,
  // or (its rail failed, with failover on) reports it lost to be redone.
  virtual void run(TaskContext& ctx) = 0;
  // The task that runs this one again on rail `target` as `pass` (kRedo or kRedoForOthers), with
  // the input this one kept (moved into it); null when there is nothing to redo (its operation
  // ended without it). Called with the ledger's lock held, once the rail's worker has drained.
  virtual std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) = 0;
  // The job cannot go on and this task, lost, waits for a redo that will not come: completes its
  // part of the operation with the fatal error (ctx.fatal_error).
  virtual void abandon(TaskContext& ctx) = 0;
  // Input bytes a redo starts from (logs only).
  virtual size_t redo_bytes() const { return 0; }

  int rail() const { return rail_; }
  Pass pass() const { return pass_; }
  bool for_others() const { return pass_ == Pass::kRedoForOthers; }
  bool is_redo() const { return pass_ != Pass::kFirst; }

  uint64_t seq = 0;              // the operation's number on the rail, set when it is posted
  State state = State::kQueued;  // guarded by the context's ledger lock

 private:
  const int rail_;
  const Pass pass_;
};

}  // namespace nezha::engine
