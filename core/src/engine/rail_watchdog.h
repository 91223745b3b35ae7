// Notices a rail that stopped moving data. A link that goes down (or is throttled to nearly
// nothing) raises no socket error: TCP just waits, for minutes. Each rail worker announces the share
// it starts and the time it should take at most; this thread sleeps until the earliest such limit
// and reports a rail whose share is still running then, so the engine can move the work to the
// other rails within a fraction of a second instead of NEZHA_TIMEOUT_S.
//
// Sleeps on a condition variable (no polling) and reports each overdue share once.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"

namespace nezha::engine {

class RailWatchdog {
 public:
  // on_overdue(rail, what) runs on the watchdog thread; it must not block for long.
  using Callback = std::function<void(int rail, const std::string& what)>;
  RailWatchdog(size_t num_rails, Callback on_overdue);
  ~RailWatchdog();
  RailWatchdog(const RailWatchdog&) = delete;
  RailWatchdog& operator=(const RailWatchdog&) = delete;

  // The rail's worker started work that must finish within `limit_s` (`what` names it).
  void begin(int rail, double limit_s, std::string what);
  // The work finished (or failed) on its own.
  void end(int rail);
  void stop();

 private:
  void run();

  struct Slot {
    bool active = false;
    bool reported = false;
    Clock::time_point due{};
    Clock::time_point started{};
    std::string what;
  };
  Callback on_overdue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace nezha::engine
