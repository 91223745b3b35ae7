// Notices a rail that stopped moving data. A link that goes down (or is throttled to nearly
// nothing) raises no socket error: TCP just waits, for minutes. While a rail's worker runs an
// operation, this thread checks that rail's byte counters (sent + received: a broadcast root only
// sends) a few times per silence limit; a rail that has moved nothing for the limit is reported, so
// the engine can move the work to the other rails within a fraction of a second instead of
// NEZHA_TIMEOUT_S.
//
// The limit adapts to the machine: it is the larger of `min_silence` and kGapFactor x the longest
// pause seen inside recent operations that completed normally (at most 1 s). On dedicated hosts
// pauses are a few milliseconds and the limit stays at the minimum; on an oversubscribed machine
// (ranks sharing cores with compute) a healthy rail can pause for 100 ms while a peer waits for a
// CPU, and the limit grows with that instead of failing healthy rails over. The wait before an
// operation's first byte is not a pause: it is peers arriving late (skew at startup can be a
// second), which the engine's stall check tells apart from a dead rail; learning from it once
// raised the limit past 3 s and hid the first cable cut of a run.
//
// A rail whose own link is gone (Rail::link_fault(): the interface lost its carrier) is reported at
// once through on_link_lost, checked every kLinkTick while the rail works: a pulled cable then
// costs a tick, not a silence limit, and is never mistaken for a late peer. While any rail works,
// and for up to 1 s after a rail's operation until what it sent is acknowledged
// (Rail::delivering(0)), the idle rails' links are checked too (reported once per loss): the host
// whose share on a rail is done is the one that can tell its cable was pulled, while a peer waits
// for its last bytes.
//
// A rail silent for the limit whose transport vouches that every connection still delivers
// (Rail::delivering: TCP has nothing unacknowledged for the limit) is reported only after twice the
// limit: its peer is most likely late (a starved CPU: 100-170 ms on 2 shared cores), which failing
// the rail over would not mend. Not longer while another rail with work moves data: a link
// throttled to nothing in the direction this rank only receives on looks the same from here. But
// while every rail with work is as silent, it is not reported at all: a peer starved of CPU stalls
// every rail it is on (a training job's backward pass holding every core stalled one for 200 ms
// and more), a broken path only its own, and with every rail stalled there is nowhere better to
// move the work (the operation's deadline still bounds the wait).
//
// Wakes only while some rail has work running or drains (sleeps on a condition variable
// otherwise); a rail that stays silent is reported again every few limits.
#pragma once

#include <chrono>
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
  // bytes_moved(rail): the rail's sent + received byte counters (thread-safe).
  // link_fault(rail) (optional): Rail::link_fault(); non-empty goes to on_link_lost(rail, what),
  // once per operation (an idle rail's: once per loss, "between operations, lost its link: ...").
  // delivering(rail, quiet) (optional): Rail::delivering().
  RailWatchdog(size_t num_rails, double min_silence_s, std::function<uint64_t(int rail)> bytes_moved,
               Callback on_stall, std::function<std::string(int rail)> link_fault = {},
               Callback on_link_lost = {},
               std::function<bool(int rail, std::chrono::milliseconds quiet)> delivering = {});
  ~RailWatchdog();
  RailWatchdog(const RailWatchdog&) = delete;
  RailWatchdog& operator=(const RailWatchdog&) = delete;

  // The rail's worker started an operation (`what` names it in the report).
  void begin(int rail, std::string what);
  // The operation finished; `ok` = normally (its pauses then teach the limit what is healthy).
  void end(int rail, bool ok);
  // The rail's worker, inside an operation, waits for something other than its peers' data (a
  // balanced part's next claim, a copy): its silence is not watched (what came before is learned
  // as by end(rail, true)), its link still is, until begin() or end(). A rank waiting for a claim
  // that its cut link will never bring is thus still reported when that link is gone.
  void pause(int rail);
  void stop();

  double limit_s(int rail);  // the current silence limit (tests, logs)
  // Raises one rail's minimum silence limit (capped at the 1 s maximum): a rail whose operations
  // legitimately pause longer (a hierarchical allreduce across hosts: a rank waits while the other
  // host's ranks work over shared memory). Call before the rail's first operation.
  void set_min_silence(int rail, double seconds);

 private:
  void run();
  Clock::duration limit_locked(int rail) const;

  struct Slot {
    bool active = false;
    uint64_t bytes = 0;
    Clock::time_point last_progress{};
    bool silence_watched = false;     // active and not paused: silence counts
    bool moved = false;               // the current operation has moved a byte
    bool link_reported = false;       // the current operation's link loss was reported
    bool idle_link_reported = false;  // the link, lost while the rail was idle, was reported
    bool draining = false;            // idle, what the last operation sent maybe not yet delivered
    Clock::time_point drain_until{};
    Clock::duration longest_pause{};  // within the current operation, after its first byte
    Clock::duration healthy_pause{};  // decaying maximum over operations that completed
    Clock::duration min_silence{};    // this rail's own floor (set_min_silence), 0: the shared one
    std::string what;
  };
  void learn_locked(Slot& s);  // folds the silence since the last byte into the healthy pause
  // Whether another rail with work has moved data since `since` (true with no other rail working).
  bool another_rail_progressed_locked(size_t rail, Clock::time_point since) const;
  Clock::duration min_silence_;
  std::function<uint64_t(int)> bytes_moved_;
  Callback on_stall_;
  std::function<std::string(int)> link_fault_;
  std::function<bool(int, std::chrono::milliseconds)> delivering_;
  Callback on_link_lost_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  bool idle_ = true;  // waiting without a timeout: begin() must wake it
  std::thread thread_;
};

}  // namespace nezha::engine
