#include "engine/handle.h"

#include <chrono>

namespace nezha::engine {

bool OpHandle::poll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool OpHandle::wait_for(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; });
}

std::string OpHandle::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void OpHandle::complete(std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    if (queue_) queue_->push(token_);
    queue_.reset();
  }
  cv_.notify_all();
}

void OpHandle::notify(std::shared_ptr<CompletionQueue> queue, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) {
    queue->push(token);
    return;
  }
  queue_ = std::move(queue);
  token_ = token;
}

}  // namespace nezha::engine
