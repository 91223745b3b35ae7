// What the executor keeps about an operation in flight, shared by the tasks that carry its shares
// (task_kinds.h); used by the execution/ files only.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "engine/execution/buffer_pool.h"
#include "engine/execution/share_balancer.h"
#include "engine/request.h"
#include "engine/tensor_entry.h"
#include "multirail/rail_table.h"

namespace nezha::engine {

// Several broadcasts, allgathers or reducescatters fused into one response (executor_fused.cc):
// the response and tensors as negotiated; the job runs their packed operation.
struct FusedTensors {
  Response resp;
  std::vector<TensorEntry> entries;
  BufferPool::Buffer buffer;  // the packed input (a broadcast's: its output too)
  int index = 0, ranks = 1;    // this rank's place among the ranks taking part, their number
};

// This rank's index among the ranks taking part (`members`: a process set's; null: every rank of
// `size`), and their number.
inline std::pair<int, int> place_among(const std::vector<int>* members, int rank, int size) {
  if (!members) return {rank, size};
  const auto it = std::find(members->begin(), members->end(), rank);
  return {static_cast<int>(it - members->begin()), static_cast<int>(members->size())};
}

// A broadcast, allgather, alltoall or reducescatter: whole on one rail, or striped over several
// (resp.plan has a share per rail; each carries its part of every block, striped_parts.h).
struct SingleJob {
  Response resp;
  TensorEntry entry;
  std::shared_ptr<FusedTensors> fused;  // `entry` is their packed operation; null: one tensor
  std::shared_ptr<const std::vector<int>> members;  // its process set's; null: every rank
  std::atomic<bool> finished{false};
  // Striped: parts not yet done (each part counts once: done, failed for good, or skipped by
  // fail_all), and the first error; the handle completes when the count reaches zero.
  std::atomic<int> parts_left{1};
  std::mutex mu;
  std::string error;
  // Striped and re-split among its rails while it runs (striped_part_task.cc); null: as planned.
  std::unique_ptr<ShareBalancer> balancer;
  // Balanced, with failover: each range's parts of the input, saved as the range first runs, at
  // their offsets in the caller's input (ranges never overlap, so the rails share it).
  BufferPool::Buffer original;

  // Bytes of this rank's input: a broadcast's or reducescatter's whole, an allgather's or
  // alltoall's own.
  size_t input_bytes() const;
  // Completes the handle with `error` (empty: success), once; a fused operation's tensors each get
  // their part of the result first (executor_fused.cc).
  void complete(const std::string& error);
  // A striped part is done, or failed for good with `error`; the last one completes the handle.
  void part_done(const std::string& error);
};

// One (possibly fused) allreduce in flight, shared by the tasks that carry its shares.
struct AllreduceJob {
  Response resp;
  std::vector<TensorEntry> entries;
  BufferPool::Buffer fusion;      // empty when a lone tensor is reduced in its own output
  uint8_t* data = nullptr;
  // Where the shares read the input: `data` itself (a fusion buffer, a tensor reduced in place, or
  // one copied into its output to be prescaled there), or a lone tensor's own input, reduced out of
  // place into `data` (valid while the job is unfinished on this rank; see Executor::run_allreduce).
  const uint8_t* input = nullptr;
  int size = 1;  // ranks taking part: the job's, or the process set's
  std::shared_ptr<const std::vector<int>> members;  // its process set's; null: every rank
  std::atomic<int> parts_left{0};
  std::mutex mu;
  std::string error;
  std::atomic<bool> finished{false};  // handles completed (normally or by fail_all)
  // Re-split among its rails while it runs (share_balancer.h, allreduce_tasks.cc); null: every
  // share runs as planned.
  std::unique_ptr<ShareBalancer> balancer;
  // Balanced, with failover: the input of each range, saved as the rings first overwrite it, at the
  // buffer's own byte offsets (ranges never overlap, so the rails share it); each part's task says
  // which bytes it saved.
  BufferPool::Buffer original;
  // Told how long the job took from its shares being posted (`posted`) to its result, and whether
  // it was striped (RailTable::observe_operation); null: not measured.
  multirail::RailTable* timed_by = nullptr;
  Clock::time_point posted{};
  bool striped = false;

  // One share is done; the last one completes the handles.
  void part_done();
  // One share failed for good: the job's first error is `what`; counts as done.
  void fail_part(const std::string& what);

 private:
  void finish();  // copies results out and completes the handles (or fails them with `error`)
};

}  // namespace nezha::engine
