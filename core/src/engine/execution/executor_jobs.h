// What the executor keeps about an operation in flight; shared by the executor_*.cc files only.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/execution/executor.h"
#include "engine/execution/saved_ranges.h"
#include "engine/execution/share_balancer.h"

namespace nezha::engine {

// "'a', 'b' and 3 more": names an operation in errors and the timeline.
inline std::string names_str(const Response& r) {
  std::string s;
  for (size_t i = 0; i < r.names.size() && i < 4; ++i) s += (i ? ", '" : "'") + r.names[i] + "'";
  if (r.names.size() > 4) s += " and " + std::to_string(r.names.size() - 4) + " more";
  return s;
}

// Several broadcasts, allgathers or reducescatters fused into one response (executor_fused.cc):
// the response and tensors as negotiated; the job runs their packed operation.
struct Executor::FusedTensors {
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
struct Executor::SingleJob {
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
  // Striped and re-split among its rails while it runs (executor_striped.cc); null: as planned.
  std::unique_ptr<ShareBalancer> balancer;
  // Balanced, with failover: each range's parts of the input, saved as the range first runs, at
  // their offsets in the caller's input (ranges never overlap, so the rails share it).
  BufferPool::Buffer original;
};

// One (possibly fused) allreduce in flight, shared by the rail jobs that carry its shares.
struct Executor::AllreduceJob {
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
  // Re-split among its rails while it runs (share_balancer.h, executor_balanced.cc); null: every
  // share runs as planned.
  std::unique_ptr<ShareBalancer> balancer;
  // Balanced, with failover: the input of each range, saved as the rings first overwrite it, at the
  // buffer's own byte offsets (ranges never overlap, so the rails share it); each part's record
  // says which bytes it saved.
  BufferPool::Buffer original;
};

// One share of an allreduce on one rail, kept in the rail's ledger while failover is on.
struct Executor::ShareRecord {
  enum class State { kQueued, kRunning, kDone, kLost };
  std::shared_ptr<AllreduceJob> job;     // an allreduce share, or
  std::shared_ptr<SingleJob> single;     // a whole one-rail collective (share: rail only)
  multirail::RailShare share;  // share.rail: the rail it runs on
  size_t part = 0;             // which share of the plan (a balanced allreduce's ranges follow it)
  uint64_t seq = 0;
  State state = State::kQueued;  // guarded by ledger_mu_
  // The input, for a redo. A single op's is copied whole when it first starts; an allreduce share's
  // range by range as its ring first overwrites them (`saved`, offsets within the share; the bytes
  // not in `saved` still hold the input, in the job's input).
  BufferPool::Buffer original;
  size_t original_bytes = 0;
  SavedRanges saved;
  bool skipped = false;       // another process set's operation: no data, done at once
  bool striped = false;       // single: one rail's part of a striped collective
  bool is_redo = false;       // restores the input before running
  bool into_scratch = false;  // this rank had completed it: run for the others, keep nothing
};

}  // namespace nezha::engine
