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
  }
  cv_.notify_all();
}

}  // namespace nezha::engine
