// TaskContext: what the executor (executor.h) shares with the tasks its rail workers run
// (share_task.h): the rails, their watchdog, buffers, the observers every share reports to, each
// rail's progress, and the ledger (task_ledger.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "engine/execution/buffer_pool.h"
#include "engine/execution/executor.h"
#include "engine/execution/share_task.h"
#include "engine/execution/task_ledger.h"
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
  multirail::RailTable* const table;  // may be null: nothing is measured
  const ShareObserver observer;       // may be empty
  const ExecutorHooks hooks;
  BufferPool pool;
  // Input copies kept for redo: one per operation in flight, reused step after step (a fresh 100 MB
  // allocation per step costs more in page faults than the copy itself).
  BufferPool originals{64, size_t{1} << 30};
  // Bytes of inputs copied aside for a redo (Executor::bytes_kept_for_redo); tasks add what they copy.
  std::atomic<uint64_t> kept_bytes{0};

  collectives::CollectiveOptions collective_options(uint64_t seq, double timeout_s) const;
  // The rail as the point-to-point rail every algorithm needs (a collective rail runs what it runs
  // itself). Throws InvalidArgument naming the rail and `what` for a collective rail (the rail table
  // gives one nothing but the allreduces it reduces and the operations of every rank it runs).
  transport::PointToPointRail& point_to_point(int rail, const std::string& what) const;
  // The rail's host lane (transport/host_lane.h), or null: not point to point, or none offered.
  transport::HostLane* host_lane(int rail) const;
  // An allreduce of `in` into `out` (the same buffer: in place) on one rail: reduced by a collective
  // rail itself, hierarchical over a rail's host lane, or flat. Flat, with `call_seconds`, each
  // receiving data call's time is appended there (CallTimingRail).
  void allreduce_on(int rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                    const collectives::CollectiveOptions& copt, std::vector<double>* call_seconds = nullptr);
  // Tells the observer, and with `measure` the rail table (allreduce patterns only: its cost models
  // fit the ring), what a share on `rail` carried since `start`. With the share's data calls timed
  // (`call_seconds`, may be null or empty), the table learns only the rail's part of the time
  // (multirail/share_timing.h: not the waits for late peers).
  void observe(int rail, size_t bytes, Clock::time_point start, const std::string& what, bool measure,
               const std::vector<double>* call_seconds = nullptr);

  // --- Progress and the ledger (executor.h explains failover) ---
  // A task starts, completes, or fails on its rail: moves the rail's counters and, with failover,
  // the task's state in the ledger. lost() returns true when the task was marked lost and reported
  // (hooks.on_rail_error) for a redo, false when it failed for good (no failover, or fail_all).
  void started(ShareTask& task);
  void done(ShareTask& task);
  bool lost(ShareTask& task, const std::string& what);
  bool fatal() const { return ledger.failed(); }
  // With fail_all called: "<op> of <names>: <reason>", else "".
  std::string fatal_error(const Response& resp) const;

  TaskLedger ledger;  // holds tasks with failover on only
  std::unique_ptr<std::atomic<uint64_t>[]> completed;  // per rail: Executor::completed()
  std::unique_ptr<std::atomic<uint64_t>[]> running;    // per rail: Executor::running()
  // With failover and a hook to report to; else null. Last: its thread reads the members above.
  std::unique_ptr<RailWatchdog> watchdog;
};

// "'a', 'b' and 3 more": names an operation in errors and the timeline.
std::string names_str(const Response& r);

}  // namespace nezha::engine
