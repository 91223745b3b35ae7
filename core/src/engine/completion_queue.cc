#include "engine/completion_queue.h"

#include <chrono>
#include <utility>

namespace nezha::engine {

void CompletionQueue::push(uint64_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(token);
  }
  cv_.notify_one();
}

std::vector<uint64_t> CompletionQueue::pop(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return closed_ || !tokens_.empty(); });
  std::vector<uint64_t> out;
  out.swap(tokens_);
  return out;
}

void CompletionQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace nezha::engine
