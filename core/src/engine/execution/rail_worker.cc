#include "engine/execution/rail_worker.h"

#include "common/thread_name.h"

namespace nezha::engine {

RailWorker::RailWorker() : thread_([this] { run(); }) {}

RailWorker::~RailWorker() { stop(); }

void RailWorker::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

bool RailWorker::try_run_inline(const std::function<void()>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || !jobs_.empty() || stopping_) return false;
    busy_ = true;
  }
  // Clear busy_ even if the job throws, or the worker would never run another job.
  struct Release {
    RailWorker* w;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(w->mu_);
        w->busy_ = false;
      }
      w->cv_.notify_one();
    }
  } release{this};
  job();
  return true;
}

void RailWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

size_t RailWorker::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

void RailWorker::run() {
  name_this_thread("nz-rail");
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (stopping_ || !jobs_.empty()) && !busy_; });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    job();  // jobs catch their own exceptions and complete their handles
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

}  // namespace nezha::engine
