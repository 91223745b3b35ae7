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
  // Queues `job` without waking the worker: for a caller that is about to wait for it anyway and
  // runs it itself (run_front_here), saving the worker's wake-up and its own. The caller must then
  // run it or announce() it, or it waits for the worker's next wake-up.
  void post_unannounced(std::function<void()> job);
  // Runs the oldest queued job on the calling thread if the worker is idle; false if none ran.
  bool run_front_here();
  // Wakes the worker if it is idle with jobs queued (after post_unannounced).
  void announce();
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

  // Ends a job run on another thread (try_run_inline, run_front_here), even one that threw.
  struct Borrowed;
};

}  // namespace nezha::engine
