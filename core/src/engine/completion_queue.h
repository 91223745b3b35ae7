// Where completed operations announce themselves, for a caller that waits for whichever of many
// operations finishes first: torch.distributed's work objects complete their futures as the engine
// finishes them, in any order (waiting for them in submission order deadlocks a program whose
// earlier receive needs a later send of its own).
//
// Threads: the engine's (OpHandle::complete pushes) and one consumer (pop). Lock order: an
// OpHandle's mutex, then this queue's; the queue calls nothing while holding its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace nezha::engine {

class CompletionQueue {
 public:
  void push(uint64_t token);
  // Waits up to timeout_s for a token, then returns every token queued (in completion order);
  // empty when the timeout passed first or the queue was closed.
  std::vector<uint64_t> pop(double timeout_s);
  // Wakes a waiting pop() for good: later pops return at once.
  void close();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> tokens_;
  bool closed_ = false;
};

}  // namespace nezha::engine
