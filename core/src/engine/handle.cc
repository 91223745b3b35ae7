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

void OpHandle::on_done(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      on_done_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void OpHandle::complete(std::string error) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    callbacks.swap(on_done_);
  }
  cv_.notify_all();
  for (auto& fn : callbacks) fn();
}

}  // namespace nezha::engine
