// Runs negotiated operations on the rails. The engine thread calls execute() for each response in
// the order the coordinator sent it; the executor copies inputs into a fusion buffer when several
// tensors were fused, posts each rail's share to that rail's worker, and completes the handles when
// the last share finishes. Rails run independently: a slow rail delays only the operations that
// have a share on it.
//
// Failover (with several rails). Every allreduce share is entered in its rail's ledger with a copy
// of its input range, taken when the share starts, and kept until every rank has completed that
// share (the watermark rank 0 sends). A share that fails, or that the watchdog finds overdue, is not
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
#include "transport/hierarchical_rail.h"
#include "transport/rail.h"

namespace nezha::engine {

struct ExecutorOptions {
  int rank = 0;
  int size = 1;
  double timeout_s = 30;
  size_t segment_bytes = 1 << 20;
  size_t logstep_max_bytes = 65536;
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
// bytes, when it started and how long it took, and what it carried. Feeds the timeline; the cost
// models are fed by the workers' report to the rail table.
using ShareObserver = std::function<void(int rail, size_t bytes, Clock::time_point start,
                                         double seconds, const std::string& what)>;

class RailWatchdog;  // failover/rail_watchdog.h
class PartWatch;  // executor_striped.cc: the watchdog's watch over one striped part

class Executor {
 public:
  // `table` (may be null: nothing is measured) hears every allreduce share's time, from the
  // worker that ran it.
  Executor(ExecutorOptions opt, std::vector<transport::Rail*> rails, multirail::RailTable* table,
           ShareObserver observer, ExecutorHooks hooks = {});
  ~Executor();

  // Allreduce shares (and calibration, probes) on rail i run the hierarchical allreduce over
  // rails[i]'s host lane where rails[i] is non-null and hierarchical() (engine, before any work).
  // After the rails connected (the placement is known).
  void use_hierarchical(std::vector<transport::HierarchicalRail*> rails);

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

  // Waits until every posted job has run (bounded); stops the workers.
  void stop();

  // Bytes of allreduce inputs copied on the engine thread before their rails could start (into
  // fusion buffers, or a prescaled lone tensor into its output); a lone tensor is read where it is
  // (any thread; tests and EngineStats).
  uint64_t bytes_staged() const { return staged_bytes_; }

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
  uint64_t running(int rail) const { return running_[rail]; }
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
  struct AllreduceJob;
  struct SingleJob;
  struct ShareRecord;
  struct FusedTensors;
  void post_share(std::shared_ptr<ShareRecord> rec, bool may_inline);
  void run_share(ShareRecord& rec);          // an allreduce share
  // A share of a balanced allreduce (executor_balanced.cc): the ranges the leader hands its rail, or
  // in a redo the ranges it had handed the part.
  void run_balanced_share(ShareRecord& rec);
  // Runs one range of a balanced share on `rail` (the record's rail, or its process set's view):
  // into scratch when the record says so, from the saved input in a redo.
  void run_balanced_range(ShareRecord& rec, transport::Rail& rail, const ShareBalancer::Range& range);
  // Before an allreduce share runs: false when it must not (its job finished; with fail_all, it is
  // counted as failed).
  bool share_may_run(ShareRecord& rec);
  // An allreduce share threw on `rail_name`: ends the watchdog's watch, then marks the share lost for
  // a redo, or fails its part for good (naming the cause fail_all gave, if any).
  void share_failed(ShareRecord& rec, const std::string& rail_name, const std::string& error);
  // Whether an operation of `bytes` with this plan (an allreduce, or a striped broadcast,
  // allgather, reducescatter or alltoall) is re-split while it runs, in ranges of at least
  // `min_range_bytes` (opt_.balance_bytes, or more where the collective needs larger pieces).
  bool balances(const std::vector<multirail::RailShare>& plan, size_t bytes, int size, size_t min_range_bytes) const;
  void run_single_record(ShareRecord& rec);  // a one-rail collective
  void run_skipped(ShareRecord& rec);        // another process set's: counts as done
  // `rail`: the operation's rail, or its process set's view of it (rank() and size() in the set;
  // `members` the set's job ranks, null for every rank).
  void run_single(const Response& resp, const TensorEntry& e, transport::Rail& rail,
                  const std::vector<int>* members, uint64_t seq, const void* input, void* output,
                  OpResult& res);
  // The members of resp's process set; null for the global set. Throws NezhaError for a set this
  // rank does not know.
  std::shared_ptr<const std::vector<int>> members_of(const Response& resp) const;
  static size_t single_input_bytes(const SingleJob& job);
  void part_done(AllreduceJob& job);
  // One share of `job` failed for good: the job's first error is `what`; counts as done.
  void fail_part(AllreduceJob& job, const std::string& what);
  // With fail_all called: "<op> of <names>: <reason>", else "".
  std::string fatal_error(const Response& resp) const;
  collectives::CollectiveOptions options(uint64_t seq, double timeout_s) const;
  // A zeroed float32 allreduce of `bytes` on the rail, timed and reported to the observer as
  // `label`; on the rail's worker (calibration, probes).
  void timed_test_allreduce(int rail, size_t bytes, uint64_t seq, double timeout_s, const char* label,
                            bool observe = true);
  // Ledger bookkeeping shared by allreduce shares and one-rail collectives (executor_failover.cc):
  // the record starts (keeps a copy of `bytes` at `input` on its first run), completes, or fails
  // (returns true when it was marked lost for a redo rather than failed for good).
  // `pack`, if given, writes the copy instead of a memcpy from `input` (a striped share's parts).
  void record_started(ShareRecord& rec, const void* input, size_t bytes,
                      const std::function<void(uint8_t*)>& pack = {});
  // Failover: keeps bytes [offset, offset + bytes) of an allreduce share's input (`input`: where the
  // algorithm reads it) before the algorithm first overwrites them in its output; restore_input
  // rebuilds the input in target from those and the rest of `range` (the share's input in the job).
  void save_before_overwrite(ShareRecord& rec, const uint8_t* input, size_t offset, size_t bytes);
  void restore_input(const ShareRecord& rec, uint8_t* target, const uint8_t* range, size_t bytes);
  void record_done(ShareRecord& rec);
  bool record_lost(ShareRecord& rec, const std::string& what);
  // An allreduce of `in` into `out` (the same buffer: in place) on one rail: flat, or hierarchical
  // where use_hierarchical() said so.
  void allreduce_on(int rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                    const collectives::CollectiveOptions& copt);
  void run_allreduce(const Response& resp, std::vector<TensorEntry> entries);
  // `fused`: the tensors `resp` (their packed operation, run_fused) stands for; null for one tensor.
  void run_on_one_rail(const Response& resp, std::vector<TensorEntry> entries,
                       std::shared_ptr<FusedTensors> fused = nullptr);
  // Striped broadcast, allgather, alltoall, reducescatter (executor_striped.cc): one record per
  // share of the plan, each carrying its part of every block, read and written in place; balanced
  // as allreduces are (range by range) where balances() says so.
  void run_striped(const Response& resp, std::vector<TensorEntry> entries, std::shared_ptr<FusedTensors> fused);
  // Broadcasts, allgathers or reducescatters fused into one response (executor_fused.cc): packed
  // into one operation of their kind that runs as a lone tensor's would.
  void run_fused(const Response& resp, std::vector<TensorEntry> entries);
  // Completes a broadcast's, allgather's, alltoall's or reducescatter's handle with `error` (empty:
  // success); a fused operation's tensors each get their part of the result first.
  void complete_single(SingleJob& job, const std::string& error);
  static void unpack_fused(SingleJob& job);
  void run_striped_part(ShareRecord& rec);
  // The parts of every block that [offset, offset + count) of the plan carries, on `rail` (the
  // record's, or its process set's view); `watch` is paused while this rank only computes.
  void run_striped_range(ShareRecord& rec, transport::Rail& rail, size_t offset, size_t count, PartWatch& watch);
  void striped_part_done(SingleJob& job, const std::string& error);
  static void finish_allreduce(AllreduceJob& job);

  ExecutorOptions opt_;
  std::vector<transport::Rail*> rails_;
  std::vector<transport::HierarchicalRail*> hierarchical_;  // per rail, may be empty / null
  multirail::RailTable* table_;
  ShareObserver observer_;
  BufferPool pool_;
  // Input copies kept for redo: one per operation in flight, reused step after step (a fresh 100 MB
  // allocation per step costs more in page faults than the copy itself).
  BufferPool originals_{64, size_t{1} << 30};
  ExecutorHooks hooks_;
  std::vector<uint64_t> seq_;  // next operation number per rail (engine thread only)
  std::unique_ptr<std::atomic<uint64_t>[]> completed_;  // per rail, see completed()
  std::unique_ptr<std::atomic<uint64_t>[]> running_;    // per rail, see running()
  // Per rail: a share was lost here and no redo has moved it yet. Another process set's shares
  // behind it on the rail then count as lost too (run_skipped): done at once on the aborted rail,
  // they moved completed() past the lost share, and the redo agreed from it left it out.
  std::unique_ptr<std::atomic<bool>[]> lost_;
  mutable std::mutex ledger_mu_;
  std::vector<std::deque<std::shared_ptr<ShareRecord>>> ledger_;  // per rail, in seq order
  std::atomic<bool> fatal_{false};
  std::atomic<uint64_t> staged_bytes_{0};  // bytes_staged()
  std::string fatal_reason_;  // guarded by ledger_mu_; set once, with fatal_
  std::unique_ptr<RailWatchdog> watchdog_;
  std::vector<std::unique_ptr<RailWorker>> workers_;  // last: destroyed first
};

}  // namespace nezha::engine
