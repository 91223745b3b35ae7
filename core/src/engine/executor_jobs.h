// What the executor keeps about an operation in flight; shared by executor.cc and
// executor_failover.cc only.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/executor.h"

namespace nezha::engine {

// One (possibly fused) allreduce in flight, shared by the rail jobs that carry its shares.
struct Executor::AllreduceJob {
  Response resp;
  std::vector<TensorEntry> entries;
  BufferPool::Buffer fusion;      // empty when a lone tensor is reduced in its own output
  uint8_t* data = nullptr;
  int size = 1;
  std::atomic<int> parts_left{0};
  std::mutex mu;
  std::string error;
  std::atomic<bool> finished{false};  // handles completed (normally or by fail_all)
};

// One share of an allreduce on one rail, kept in the rail's ledger while failover is on.
struct Executor::ShareRecord {
  enum class State { kQueued, kRunning, kDone, kLost };
  std::shared_ptr<AllreduceJob> job;
  multirail::RailShare share;  // share.rail: the rail it runs on
  uint64_t seq = 0;
  State state = State::kQueued;  // guarded by ledger_mu_
  BufferPool::Buffer original;   // the range's input, taken when the share first started
  size_t original_bytes = 0;
  bool is_redo = false;       // restores `original` before running
  bool into_scratch = false;  // this rank had completed it: run for the others, keep nothing
};

}  // namespace nezha::engine
