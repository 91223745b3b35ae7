// Completion state of one submitted tensor. The engine completes it exactly once, from whichever
// thread finished the operation; callers poll or wait with a timeout.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/output_pool.h"

namespace nezha::engine {

// Uninitialised, large ones pooled (output_pool.h).
using OutputBytes = std::vector<uint8_t, OutputAllocator<uint8_t>>;

struct OpResult {
  OutputBytes output;                   // engine-allocated output (allgather, alltoall, reducescatter)
  std::vector<int64_t> output_shape;    // shape of `output`
  std::vector<int64_t> received_splits; // alltoall: rows received from each rank
  int32_t last_joined_rank = -1;        // join
};

class OpHandle {
 public:
  bool poll() const;
  // True when done within timeout_s; false when the timeout passed first.
  bool wait_for(double timeout_s) const;
  // Meaningful once done: empty on success, else the message to raise.
  std::string error() const;
  OpResult& result() { return result_; }  // read after done; written before complete()

  // Runs `fn` once the handle is done: at once on this thread when it already is, else on the
  // thread that completes it, after waiters are woken. For callers that cannot block a thread on
  // wait_for (TensorFlow's async kernels; a CompletionQueue that one thread waits on for many
  // operations): `fn` runs on the engine's threads, sometimes under its locks, so it must only
  // hand the completion on (no blocking, no call into the engine).
  void on_done(std::function<void()> fn);

  void complete(std::string error = {});

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  OpResult result_;
  std::vector<std::function<void()>> on_done_;
};

}  // namespace nezha::engine
