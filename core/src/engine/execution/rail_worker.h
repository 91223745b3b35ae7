// One thread per rail that runs that rail's share of each operation, in the order the engine posts
// them (the same order on every rank, so the point-to-point messages of consecutive collectives
// pair up). Sleeps on a condition variable when idle.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace nezha::engine {

class RailWorker {
 public:
  RailWorker();
  ~RailWorker();
  RailWorker(const RailWorker&) = delete;
  RailWorker& operator=(const RailWorker&) = delete;

  void post(std::function<void()> job);
  // Runs `job` on the calling thread if the worker is idle with nothing queued (saves a thread
  // handoff on the latency-critical small-message path); otherwise returns false and does nothing.
  bool try_run_inline(const std::function<void()>& job);
  // Runs the jobs already posted, then stops the thread.
  void stop();
  size_t queued() const;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  bool busy_ = false;  // a job is running, on the worker or inline
  std::thread thread_;
};

}  // namespace nezha::engine
