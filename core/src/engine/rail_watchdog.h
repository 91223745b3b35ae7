// Notices a rail that stopped moving data. A link that goes down (or is throttled to nearly
// nothing) raises no socket error: TCP just waits, for minutes. While a rail's worker runs an
// operation, this thread checks that rail's received-byte counter every quarter of `silence`; a rail
// that has received nothing for `silence` is reported, so the engine can move the work to the other
// rails within a fraction of a second instead of NEZHA_TIMEOUT_S. Progress, not total time, is the
// test: a large share on a slow but working rail is never reported, and neither is a peer that is a
// little late on a loaded machine.
//
// Wakes only while some rail has work running (sleeps on a condition variable otherwise); a rail
// that stays silent is reported again every few silences.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"

namespace nezha::engine {

class RailWatchdog {
 public:
  // on_stall(rail, what) runs on the watchdog thread; it must not block for long.
  using Callback = std::function<void(int rail, const std::string& what)>;
  // bytes_received(rail): the rail's received-byte counter (thread-safe).
  RailWatchdog(size_t num_rails, double silence_s, std::function<uint64_t(int rail)> bytes_received,
               Callback on_stall);
  ~RailWatchdog();
  RailWatchdog(const RailWatchdog&) = delete;
  RailWatchdog& operator=(const RailWatchdog&) = delete;

  // The rail's worker started an operation (`what` names it in the report).
  void begin(int rail, std::string what);
  // The operation finished (or failed) on its own.
  void end(int rail);
  void stop();

 private:
  void run();

  struct Slot {
    bool active = false;
    uint64_t bytes = 0;
    Clock::time_point last_progress{};
    std::string what;
  };
  Clock::duration silence_;
  std::function<uint64_t(int)> bytes_received_;
  Callback on_stall_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  bool idle_ = true;  // waiting without a timeout: begin() must wake it
  std::thread thread_;
};

}  // namespace nezha::engine
