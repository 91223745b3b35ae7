#include "engine/execution/rail_worker.h"

#include "common/thread_name.h"

namespace nezha::engine {

// Clears busy_ even if the job threw, or the worker would never run another job.
struct RailWorker::Borrowed {
  RailWorker* w;
  ~Borrowed() {
    bool queued;
    {
      std::lock_guard<std::mutex> lock(w->mu_);
      w->busy_ = false;
      queued = !w->jobs_.empty() || w->stopping_;
    }
    // Only then: waking an idle worker with nothing to take costs a context switch per operation.
    if (queued) w->cv_.notify_one();
  }
};

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
  Borrowed borrowed{this};
  job();
  return true;
}

void RailWorker::post_unannounced(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(job));
}

bool RailWorker::run_front_here() {
  std::function<void()> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || jobs_.empty() || stopping_) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
  }
  Borrowed borrowed{this};
  job();  // jobs catch their own exceptions and complete their handles
  return true;
}

void RailWorker::announce() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!busy_ && !jobs_.empty()) cv_.notify_one();
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
