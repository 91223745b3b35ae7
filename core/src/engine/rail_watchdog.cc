#include "engine/rail_watchdog.h"

#include <algorithm>
#include <chrono>

namespace nezha::engine {

RailWatchdog::RailWatchdog(size_t num_rails, Callback on_overdue)
    : on_overdue_(std::move(on_overdue)), slots_(num_rails), thread_([this] { run(); }) {}

RailWatchdog::~RailWatchdog() { stop(); }

void RailWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RailWatchdog::begin(int rail, double limit_s, std::string what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[rail];
    s.active = true;
    s.reported = false;
    s.started = Clock::now();
    s.due = s.started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
    s.what = std::move(what);
  }
  cv_.notify_all();
}

void RailWatchdog::end(int rail) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[rail].active = false;  // no notify: an earlier wakeup just finds nothing due
}

void RailWatchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    std::vector<std::pair<int, std::string>> overdue;
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.active || s.reported) continue;
      if (s.due <= now) {
        s.reported = true;
        double ms = std::chrono::duration<double, std::milli>(now - s.started).count();
        overdue.emplace_back(static_cast<int>(i), s.what + " still running after " +
                                                      std::to_string(static_cast<int>(ms)) + " ms");
      } else {
        next = std::min(next, s.due);
      }
    }
    if (!overdue.empty()) {
      lock.unlock();
      for (const auto& [rail, what] : overdue) on_overdue_(rail, what);
      lock.lock();
      continue;
    }
    if (next == Clock::time_point::max()) cv_.wait(lock);
    else cv_.wait_until(lock, next);
  }
}

}  // namespace nezha::engine
