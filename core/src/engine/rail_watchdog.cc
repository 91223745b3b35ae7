#include "engine/rail_watchdog.h"

#include <chrono>

namespace nezha::engine {
namespace {
constexpr int kReportAgainAfter = 4;  // silences
}  // namespace

RailWatchdog::RailWatchdog(size_t num_rails, double silence_s,
                           std::function<uint64_t(int rail)> bytes_received, Callback on_stall)
    : silence_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(silence_s))),
      bytes_received_(std::move(bytes_received)),
      on_stall_(std::move(on_stall)),
      slots_(num_rails),
      thread_([this] { run(); }) {}

RailWatchdog::~RailWatchdog() { stop(); }

void RailWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RailWatchdog::begin(int rail, std::string what) {
  uint64_t bytes = bytes_received_(rail);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[rail];
    s.active = true;
    s.bytes = bytes;
    s.last_progress = Clock::now();
    s.what = std::move(what);
    wake = idle_;  // a ticking watchdog sees the new work on its next tick: no wakeup per operation
  }
  if (wake) cv_.notify_all();
}

void RailWatchdog::end(int rail) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[rail].active = false;  // no notify: the next check just finds nothing to watch
}

void RailWatchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    bool watching = false;
    std::vector<std::pair<int, std::string>> stalled;
    Clock::time_point now = Clock::now();
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.active) continue;
      watching = true;
      uint64_t bytes = bytes_received_(static_cast<int>(i));
      if (bytes != s.bytes) {
        s.bytes = bytes;
        s.last_progress = now;
      } else if (now - s.last_progress >= silence_) {
        double ms = std::chrono::duration<double, std::milli>(now - s.last_progress).count();
        stalled.emplace_back(static_cast<int>(i), s.what + " received nothing for " +
                                                      std::to_string(static_cast<int>(ms)) + " ms");
        // Still silent later: report again (rank 0 may have ignored the first report while the
        // rail looked like the last one up).
        s.last_progress = now + kReportAgainAfter * silence_;
      }
    }
    if (!stalled.empty()) {
      lock.unlock();
      for (const auto& [rail, what] : stalled) on_stall_(rail, what);
      lock.lock();
      continue;
    }
    idle_ = !watching;
    if (watching) cv_.wait_for(lock, silence_ / 4);
    else cv_.wait(lock);
  }
}

}  // namespace nezha::engine
