// The kinds of ShareTask (share_task.h) the executor posts to its rail workers.
#pragma once

#include <memory>
#include <string>

#include "engine/execution/buffer_pool.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/saved_ranges.h"
#include "engine/execution/share_balancer.h"
#include "engine/execution/share_task.h"
#include "multirail/planner.h"
#include "transport/rail.h"

namespace nezha::engine {

class PartWatch;  // striped_part_task.cc

// One share of an allreduce as the plan split it (allreduce_tasks.cc). Its input is saved range by
// range as the ring first overwrites it (SavedRanges); a redo rebuilds it from those and the bytes
// never overwritten, which still hold it in the job's input.
class AllreduceShare final : public ShareTask {
 public:
  AllreduceShare(std::shared_ptr<AllreduceJob> job, multirail::RailShare share, Pass pass = Pass::kFirst)
      : ShareTask(share.rail, pass), job_(std::move(job)), share_(share) {}
  void run(TaskContext& ctx) override;
  std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) override;
  void abandon(TaskContext& ctx) override;
  size_t redo_bytes() const override;

 private:
  std::shared_ptr<AllreduceJob> job_;
  multirail::RailShare share_;
  BufferPool::Buffer original_;  // share.count elements; the saved ranges' bytes are valid
  SavedRanges saved_;            // offsets within the share
};

// One part of a balanced allreduce (allreduce_tasks.cc): the ranges the leader hands its rail, or in
// a redo those it had handed the part. Ranges save their input in the job's copy (job.original);
// `saved_` says which bytes this part saved there.
class BalancedRange final : public ShareTask {
 public:
  BalancedRange(std::shared_ptr<AllreduceJob> job, int rail, size_t part, Pass pass = Pass::kFirst)
      : ShareTask(rail, pass), job_(std::move(job)), part_(part) {}
  void run(TaskContext& ctx) override;
  std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) override;
  void abandon(TaskContext& ctx) override;

 private:
  // One range on `rail` (the task's, or its process set's view).
  void run_range(TaskContext& ctx, transport::PointToPointRail& rail, const ShareBalancer::Range& range);

  std::shared_ptr<AllreduceJob> job_;
  size_t part_;
  SavedRanges saved_;  // byte offsets in the job's buffer
};

// A broadcast, allgather, alltoall or reducescatter run whole on one rail (single_op_task.cc). Its
// input is copied whole when it first runs; a redo reads that copy.
class SingleOp final : public ShareTask {
 public:
  SingleOp(std::shared_ptr<SingleJob> job, int rail, Pass pass = Pass::kFirst)
      : ShareTask(rail, pass), job_(std::move(job)) {}
  void run(TaskContext& ctx) override;
  std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) override;
  void abandon(TaskContext& ctx) override;
  size_t redo_bytes() const override;

 private:
  std::shared_ptr<SingleJob> job_;
  BufferPool::Buffer original_;
};

// One rail's part of a striped broadcast, allgather, alltoall or reducescatter
// (striped_part_task.cc): share `part` of the plan, or with a balancer the ranges its rail is handed.
// Planned, its parts of the input are copied, packed, when it first runs; balanced, each range saves
// its parts in the job's copy (job.original).
class StripedPart final : public ShareTask {
 public:
  StripedPart(std::shared_ptr<SingleJob> job, multirail::RailShare share, size_t part, Pass pass = Pass::kFirst)
      : ShareTask(share.rail, pass), job_(std::move(job)), share_(share), part_(part) {}
  void run(TaskContext& ctx) override;
  std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) override;
  void abandon(TaskContext& ctx) override;

 private:
  // The parts of every block that [offset, offset + count) of the plan carries (striped_layout),
  // on `rail` (the task's, or its process set's view); `watch` is paused while this rank only computes.
  void run_range(TaskContext& ctx, transport::PointToPointRail& rail, size_t offset, size_t count, PartWatch& watch);

  std::shared_ptr<SingleJob> job_;
  multirail::RailShare share_;
  size_t part_;
  BufferPool::Buffer original_;  // planned: the packed parts of the input, once it has started
};

// Another process set's operation this rank is not a member of (skipped_task.cc): takes its number
// on the rail and moves no data, so that later operations pair up.
class SkippedOp final : public ShareTask {
 public:
  explicit SkippedOp(int rail) : ShareTask(rail, Pass::kFirst) {}
  void run(TaskContext& ctx) override;
  std::unique_ptr<ShareTask> redo_on(int target, Pass pass, TaskContext& ctx) override;
  void abandon(TaskContext&) override {}  // nothing waits on it
};

}  // namespace nezha::engine
