// TaskContext: what the executor (executor.h) shares with the tasks its rail workers run
// (share_task.h): the rails, their watchdog, buffers, the observers every share reports to, and the
// ledger. With failover on, each task sits in its rail's ledger from when it is posted until every
// rank has completed it; the ledger's lock guards every task's state and the ledger itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "engine/execution/buffer_pool.h"
#include "engine/execution/executor.h"
#include "engine/execution/share_task.h"
#include "engine/request.h"
#include "transport/rail.h"

namespace nezha::engine {

class TaskContext {
 public:
  TaskContext(ExecutorOptions opt, std::vector<transport::Rail*> rails, multirail::RailTable* table,
              ShareObserver observer, ExecutorHooks hooks);
  ~TaskContext();
  TaskContext(const TaskContext&) = delete;
  TaskContext& operator=(const TaskContext&) = delete;

  const ExecutorOptions opt;
  const std::vector<transport::Rail*> rails;
  std::vector<transport::HierarchicalRail*> hierarchical;  // per rail, may be empty / null
  multirail::RailTable* const table;  // may be null: nothing is measured
  const ShareObserver observer;       // may be empty
  const ExecutorHooks hooks;
  BufferPool pool;
  // Input copies kept for redo: one per operation in flight, reused step after step (a fresh 100 MB
  // allocation per step costs more in page faults than the copy itself).
  BufferPool originals{64, size_t{1} << 30};
  std::unique_ptr<RailWatchdog> watchdog;  // with failover and a hook to report to; else null

  collectives::CollectiveOptions collective_options(uint64_t seq, double timeout_s) const;
  // An allreduce of `in` into `out` (the same buffer: in place) on one rail: flat, or hierarchical
  // where Executor::use_hierarchical() said so.
  void allreduce_on(int rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                    const collectives::CollectiveOptions& copt);
  // Tells the rail table (allreduce patterns only: its cost models fit the ring) and the observer
  // what a share on `rail` carried.
  void observe(int rail, size_t bytes, Clock::time_point start, const std::string& what, bool measure);

  // --- The ledger (executor.h explains failover) ---
  // A task starts, completes, or fails on its rail. lost() returns true when it was marked lost
  // and reported for a redo, false when it failed for good (no failover, or fail_all was called).
  void started(ShareTask& task);
  void done(ShareTask& task);
  bool lost(ShareTask& task, const std::string& what);
  // Per rail: a share was lost here and no redo has moved it yet (SkippedTask).
  bool lost_on(int rail) const { return lost_[rail]; }
  bool fatal() const { return fatal_; }
  // With fail_all called: "<op> of <names>: <reason>", else "".
  std::string fatal_error(const Response& resp) const;

  std::unique_ptr<std::atomic<uint64_t>[]> completed;  // per rail: Executor::completed()
  std::unique_ptr<std::atomic<uint64_t>[]> running;    // per rail: Executor::running()
  mutable std::mutex ledger_mu;
  std::vector<std::deque<std::shared_ptr<ShareTask>>> ledger;  // per rail, in seq order
  // Set with fatal, once (under ledger_mu): the reason fail_all gave.
  void set_fatal(const std::string& reason);
  // Under ledger_mu: whether `rail`'s ledger still holds a lost task.
  void update_lost(int rail);

 private:
  // Per rail: see lost_on(). Another process set's shares behind a lost one on the rail then count
  // as lost too (SkippedTask): done at once on the aborted rail, they would move completed() past
  // the lost share, and the redo agreed from it would leave it out.
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::atomic<bool> fatal_{false};
  std::string fatal_reason_;  // guarded by ledger_mu; set once, with fatal_
};

// "'a', 'b' and 3 more": names an operation in errors and the timeline.
std::string names_str(const Response& r);

}  // namespace nezha::engine
