// Runs negotiated operations on the rails. The engine thread calls execute() for each response in
// the order the coordinator sent it; the executor copies inputs into a fusion buffer when several
// tensors were fused, posts each rail's share to that rail's worker as a task (share_task.h), and
// completes the handles when the last share finishes. Rails run independently: a slow rail delays
// only the operations that have a share on it.
//
// Failover (with several rails). Every task is entered in its rail's ledger and keeps a copy of
// its input, taken as it runs, until every rank has completed that share (the watermark rank 0 sends). A share that fails, or that the watchdog finds overdue, is not
// an error: it is marked lost and reported (on_rail_error); the engine then agrees with the other
// ranks on the first share some rank has not completed, and redo() runs every share from there on a
// surviving rail from the kept copies. Ranks that had completed a share take part in its redo into
// scratch memory, so the result they already delivered is not touched. Redone shares are whole
// shares run with the same algorithm, so results stay bit-identical on every rank.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/deadline.h"
#include "engine/execution/buffer_pool.h"
#include "engine/handle.h"
#include "engine/process_sets.h"
#include "engine/execution/rail_worker.h"
#include "engine/execution/share_balancer.h"
#include "engine/request.h"
#include "engine/tensor_entry.h"
#include "multirail/rail_table.h"
#include "transport/rail.h"

namespace nezha::engine {

struct ExecutorOptions {
  int rank = 0;
  int size = 1;
  double timeout_s = 30;
  size_t segment_bytes = 1 << 20;
  size_t logstep_max_bytes = 65536;
  size_t halving_max_bytes = 262144;  // NEZHA_HALVING_MAX_BYTES
  size_t inline_max_bytes = 65536;  // allreduces up to this size may run on the engine thread
  // Striped operations of at least kBalanceMinRanges x this many bytes are re-split among their rails
  // while they run, in ranges of at least this (share_balancer.h); 0: shares run as planned. Must be
  // the same on every rank (NEZHA_BALANCE_BYTES, like NEZHA_SEGMENT_BYTES).
  size_t balance_bytes = 1 << 20;
  bool failover = false;            // keep input copies so a failed rail's shares can be redone
  double stall_s = 0.1;  // minimum silence limit of a busy rail (RailWatchdog adapts it upwards)
  // Members of the process sets responses name (process_sets.h); null: only the global set.
  const ProcessSetTable* process_sets = nullptr;
};

// Failover hooks, called from rail workers and the watchdog (any thread; must not block).
struct ExecutorHooks {
  // A share on `rail` failed (its handle is not completed: the share is lost until redone), or
  // the rail has received nothing for stall_s while busy (stalled: the share is still running).
  // `seq`: the stalled operation's sequence number on the rail.
  std::function<void(int rail, const std::string& what, bool stalled, uint64_t seq)> on_rail_error;
};

// Called from rail workers after each allreduce share (and calibration): which rail, how many
// bytes, when it started and how long it took, the part of that the rail is answerable for (what
// the cost model learned: without waits for late peers, multirail/share_timing.h), and what it
// carried. Feeds the timeline; the cost models are fed by the workers' report to the rail table.
using ShareObserver = std::function<void(int rail, size_t bytes, Clock::time_point start, double seconds,
                                         double rail_seconds, const std::string& what)>;

class RailWatchdog;  // failover/rail_watchdog.h
class ShareTask;     // share_task.h: what the rail workers run
class TaskContext;   // task_context.h: what those tasks share
struct FusedTensors;  // executor_jobs.h

// The part of `plan` with the most elements (the first of equals): the one a leading caller runs
// itself. On a host with fewer cores than rail workers, each worker woken and each caller woken
// after them is a scheduling delay: 16 ranks on 2 cores spent ~0.5 ms more per striped 64 KB
// allreduce in hand-offs than the same payload whole on one rail (benchmarks/SCALE.md).
size_t largest_share(const std::vector<multirail::RailShare>& plan);

class Executor {
 public:
  // `table` (may be null: nothing is measured) hears every allreduce share's time, from the
  // worker that ran it. Allreduce shares (and calibration, probes) on a rail that offers a host lane
  // (PointToPointRail::host_lane()) run the hierarchical allreduce over it; rails offer one only once
  // connected, so the engine builds the executor after connecting them.
  Executor(ExecutorOptions opt, std::vector<transport::Rail*> rails, multirail::RailTable* table,
           ShareObserver observer, ExecutorHooks hooks = {});
  ~Executor();

  // entries[i] belongs to resp.names[i]; an entry with no handle means this rank has joined and
  // takes part with zeros. An operation of a process set runs among its members, over views of the
  // rails (transport::GroupRail).
  void execute(const Response& resp, std::vector<TensorEntry> entries);
  // A process set's operation this rank is not a member of: takes the same operation numbers on
  // the same rails as the members (so later operations pair up), in order, and moves no data.
  void skip(const Response& resp);

  // Times a float32 allreduce of `bytes` on one rail (all ranks call it in the same order) and
  // reports it to the observer: how the cost model learns every rail before real traffic.
  void calibrate(int rail, size_t bytes, bool observe = true);  // observe: feed the rail's cost model

  // A synchronous caller leading the loop (Engine::lead). Between begin_caller_lead() and
  // end_caller_lead() an operation's only task (one share, one rail) not run on the loop at once,
  // or a striped operation's largest share, is queued without waking its rail's worker; the
  // other shares' workers start at once. end_caller_lead() returns the
  // rails holding such tasks, and run_held_here() then runs them on the caller's thread, as their
  // worker would have, while the caller waits for its operations anyway: the worker's wake-up and
  // the caller's are saved. Unlike running a share on the loop (post's may_inline) this is safe
  // with failover: the caller no longer holds the loop, so the loop thread reacts to the rail's
  // failure meanwhile. Loop holder only, except run_held_here (the caller, after the lead).
  void begin_caller_lead();
  std::vector<int> end_caller_lead();
  // Runs the held rails' queued tasks here, oldest first, until `done` (the caller's operations
  // are complete) or the rail's worker is busy; wakes the workers for whatever is left.
  void run_held_here(const std::vector<int>& rails, const std::function<bool()>& done);
  // Tasks run_held_here ran (any thread; tests and EngineStats).
  uint64_t shares_run_by_callers() const { return shares_run_by_callers_; }

  // Waits until every posted job has run (bounded); stops the workers.
  void stop();

  // Bytes of allreduce inputs copied on the engine thread before their rails could start (into
  // fusion buffers, or a prescaled lone tensor into its output); a lone tensor is read where it is
  // (any thread; tests and EngineStats).
  uint64_t bytes_staged() const { return staged_bytes_; }
  // Bytes of inputs copied aside so that a failed share could be redone on another rail (0 without
  // failover; any thread; tests and EngineStats).
  uint64_t bytes_kept_for_redo() const;

  // --- Failover (engine thread only, except where noted) ---
  // Runs `task` on the rail's worker after everything posted before it (reconnects, drain marks).
  void post_task(int rail, std::function<void()> task);
  // Posts a test allreduce of `bytes` on `rail` that runs after `prepare` (e.g. reconnecting) on
  // the rail's worker; `done(error)` gets "" on success. Counts as an operation on the rail (seq).
  void post_probe(int rail, size_t bytes, std::function<void()> prepare,
                  std::function<void(const std::string& error)> done);
  // 1 + sequence number of the last operation completed on each rail (any thread).
  std::vector<uint64_t> completed() const;
  // 1 + sequence number of the operation running on the rail now, 0 if none (any thread).
  uint64_t running(int rail) const;
  // Every share on `rail` with seq >= first is run again on `target`, in seq order. The rail's
  // worker must be idle (drained after the rail was aborted).
  void redo(int rail, uint64_t first, int target);
  // Drops kept copies of shares every rank has completed (watermark per rail).
  void trim(const std::vector<uint64_t>& watermark);
  // The job cannot go on: every unfinished operation fails with `reason`; later failures are plain
  // errors (any thread). An operation completes only once no rail touches its buffers any more: one
  // waiting for a redo at once, a queued share when its worker skips it, a running one when it has
  // failed (the engine aborts the rails next).
  void fail_all(const std::string& reason);

 private:
  void run_allreduce(const Response& resp, std::vector<TensorEntry> entries);
  // A broadcast, allgather, alltoall or reducescatter (executor_collectives.cc): whole on one rail,
  // or striped over the plan's rails, one task per share of the plan, each carrying its part of
  // every block, read and written in place; balanced as allreduces are (range by range) where
  // balances() says so. `fused`: the tensors `resp` (their packed operation, run_fused) stands for;
  // null for one tensor.
  void run_on_one_rail(const Response& resp, std::vector<TensorEntry> entries,
                       std::shared_ptr<FusedTensors> fused = nullptr);
  void run_striped(const Response& resp, std::vector<TensorEntry> entries, std::shared_ptr<FusedTensors> fused);
  // Broadcasts, allgathers or reducescatters fused into one response (executor_fused.cc): packed
  // into one operation of their kind that runs as a lone tensor's would.
  void run_fused(const Response& resp, std::vector<TensorEntry> entries);
  // Whether an operation of `bytes` with this plan (an allreduce, or a striped broadcast,
  // allgather, reducescatter or alltoall) is re-split while it runs, in ranges of at least
  // `min_range_bytes` (opt_.balance_bytes, or more where the collective needs larger pieces).
  bool balances(const std::vector<multirail::RailShare>& plan, size_t bytes, int size, size_t min_range_bytes) const;
  // leader_min_range_bytes (share_balancer.h) from this rank's estimates: only the leader's
  // minimum is ever used (balanced_ranges.h), so no rank needs another's.
  size_t leader_min_range_bytes(const std::vector<multirail::RailShare>& plan, size_t agreed_min) const;
  // The members of resp's process set; null for the global set. Throws NezhaError for a set this
  // rank does not know.
  std::shared_ptr<const std::vector<int>> members_of(const Response& resp) const;
  // A zeroed float32 allreduce of `bytes` on the rail, timed and reported to the observer as
  // `label`; on the rail's worker (calibration, probes).
  void timed_test_allreduce(int rail, size_t bytes, uint64_t seq, double timeout_s, const char* label,
                            bool observe = true);
  // Numbers `task` on its rail and, with failover, enters it in the rail's ledger; then hands it to
  // the rail's worker, or runs it on this thread when `may_inline` and the worker is idle, or holds
  // it for a leading caller (begin_caller_lead) when `for_caller`: its operation's only task, or
  // the largest share of a striped one (largest_share), whose worker would be the last to finish
  // and so the one the caller waits for; the other shares' workers start at once.
  void post(std::shared_ptr<ShareTask> task, bool may_inline = false, bool for_caller = false);
  // Hands a task already numbered and entered (a redo) to its rail's worker, as post() does.
  void post_entered(std::shared_ptr<ShareTask> task, bool may_inline, bool for_caller = false);

  const ExecutorOptions opt_;
  // The rails, watchdog, buffers, observers and ledger the tasks share (task_context.h).
  std::unique_ptr<TaskContext> ctx_;
  std::vector<uint64_t> seq_;  // next operation number per rail (engine thread only)
  std::atomic<uint64_t> staged_bytes_{0};  // bytes_staged()
  std::atomic<uint64_t> shares_run_by_callers_{0};
  bool caller_leads_ = false;       // between begin_caller_lead() and end_caller_lead()
  std::vector<int> held_rails_;     // rails holding tasks queued for the leading caller
  std::vector<std::unique_ptr<RailWorker>> workers_;  // last: destroyed first
};

}  // namespace nezha::engine
