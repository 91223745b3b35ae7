#include "engine/failover/rail_watchdog.h"

#include <algorithm>
#include <chrono>

#include "common/thread_name.h"

namespace nezha::engine {
namespace {
constexpr int kReportAgainAfter = 2;  // limits
constexpr int kTicksPerLimit = 4;
constexpr int kGapFactor = 3;         // the limit is this many times the longest healthy pause
constexpr double kHealthyDecay = 0.98;  // per completed operation: an old hiccup fades
// However slow the machine, a rail silent this long is reported: a limit learned from one freak
// pause must not hide a pulled cable for seconds.
constexpr std::chrono::seconds kMaxLimit{1};
// A silent rail whose connections still deliver is reported after this many limits instead of one.
// Its peer is late (starved of CPU) or its path is slow in a direction
// this rank does not send on (a link throttled to nothing): the grace must stay short for the latter.
constexpr int kLatePeerLimits = 2;
// How often a working rail's link is checked: one ioctl per rail, and only while it works.
constexpr std::chrono::milliseconds kLinkTick{10};
// How long an idle rail's link stays watched after its operation while what it sent is not
// acknowledged (a rail that cannot tell, Rail::delivering() false, is watched this long).
constexpr std::chrono::seconds kMaxDrainWatch{1};
}  // namespace

RailWatchdog::RailWatchdog(size_t num_rails, double min_silence_s,
                           std::function<uint64_t(int rail)> bytes_moved, Callback on_stall,
                           std::function<std::string(int rail)> link_fault, Callback on_link_lost,
                           std::function<bool(int rail, std::chrono::milliseconds quiet)> delivering)
    : min_silence_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(min_silence_s))),
      bytes_moved_(std::move(bytes_moved)),
      on_stall_(std::move(on_stall)),
      link_fault_(on_link_lost ? std::move(link_fault) : nullptr),
      delivering_(std::move(delivering)),
      on_link_lost_(std::move(on_link_lost)),
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

Clock::duration RailWatchdog::limit_locked(int rail) const {
  return std::max({min_silence_, slots_[rail].min_silence,
                   std::min<Clock::duration>(kGapFactor * slots_[rail].healthy_pause, kMaxLimit)});
}

double RailWatchdog::limit_s(int rail) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::chrono::duration<double>(limit_locked(rail)).count();
}

void RailWatchdog::set_min_silence(int rail, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[rail].min_silence = std::min<Clock::duration>(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)), kMaxLimit);
}

void RailWatchdog::begin(int rail, std::string what) {
  uint64_t bytes = bytes_moved_(rail);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[rail];
    s.active = true;
    s.silence_watched = true;
    s.bytes = bytes;
    s.last_progress = Clock::now();
    s.longest_pause = Clock::duration::zero();
    s.moved = false;
    s.link_reported = false;
    s.draining = false;
    s.what = std::move(what);
    wake = idle_;  // a ticking watchdog sees the new work on its next tick: no wakeup per operation
  }
  if (wake) cv_.notify_all();
}

void RailWatchdog::learn_locked(Slot& s) {
  if (!s.silence_watched || !s.moved) return;  // a pause was learned when it began
  s.longest_pause = std::max(s.longest_pause, Clock::now() - s.last_progress);
  auto decayed = std::chrono::duration_cast<Clock::duration>(s.healthy_pause * kHealthyDecay);
  s.healthy_pause = std::max(decayed, s.longest_pause);
}

void RailWatchdog::end(int rail, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[rail];
  if (ok) learn_locked(s);
  s.active = false;  // no notify: the next tick just finds nothing to watch
  s.idle_link_reported = s.link_reported;  // a loss reported during the operation is not news
  s.draining = true;
  s.drain_until = Clock::now() + kMaxDrainWatch;
  s.silence_watched = false;
}

void RailWatchdog::pause(int rail) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[rail];
  if (!s.active) return;
  learn_locked(s);
  s.silence_watched = false;  // still active: its link is checked on every tick
}

bool RailWatchdog::another_rail_progressed_locked(size_t rail, Clock::time_point since) const {
  bool others = false;
  for (size_t j = 0; j < slots_.size(); ++j) {
    const Slot& o = slots_[j];
    if (j == rail || !o.active || !o.silence_watched) continue;
    others = true;
    if (o.moved && o.last_progress > since) return true;
  }
  return !others;
}

void RailWatchdog::run() {
  name_this_thread("nz-watchdog");
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    bool watching = false;
    Clock::duration tick = min_silence_ / kTicksPerLimit;
    if (link_fault_) tick = std::min<Clock::duration>(tick, kLinkTick);
    std::vector<std::pair<int, std::string>> stalled, lost;
    Clock::time_point now = Clock::now();
    const bool any_active = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.active; });
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.active && link_fault_) {
        // An idle rail's link is checked too while another rail works, or while what its last
        // operation sent is not yet acknowledged (draining): a host whose share on the cut rail is
        // done, its last bytes still in flight, would otherwise not notice, and a peer waiting for
        // those bytes would report a silence instead, two limits later (it sees its own
        // connections deliver).
        if (s.draining && (now >= s.drain_until ||
                           (delivering_ && delivering_(static_cast<int>(i), std::chrono::milliseconds(0)))))
          s.draining = false;
        if (!any_active && !s.draining) continue;
        watching = true;
        std::string fault = link_fault_(static_cast<int>(i));
        if (!fault.empty() && !s.idle_link_reported)
          lost.emplace_back(static_cast<int>(i), "between operations, lost its link: " + fault);
        s.idle_link_reported = !fault.empty();
        continue;
      }
      if (!s.active || (!s.silence_watched && !link_fault_)) continue;
      watching = true;
      const Clock::duration limit = limit_locked(static_cast<int>(i));
      tick = std::min(tick, limit / kTicksPerLimit);
      if (link_fault_ && !s.link_reported) {
        std::string fault = link_fault_(static_cast<int>(i));
        if (!fault.empty()) {
          s.link_reported = true;
          lost.emplace_back(static_cast<int>(i), s.what + " lost its link: " + fault);
          continue;
        }
      }
      if (!s.silence_watched) continue;
      uint64_t bytes = bytes_moved_(static_cast<int>(i));
      if (bytes != s.bytes) {
        if (s.moved) s.longest_pause = std::max(s.longest_pause, now - s.last_progress);
        s.moved = true;
        s.bytes = bytes;
        s.last_progress = now;
      } else if (now - s.last_progress >= limit) {
        const auto silent = now - s.last_progress;
        const bool delivers =
            delivering_ &&
            delivering_(static_cast<int>(i), std::chrono::duration_cast<std::chrono::milliseconds>(limit));
        if (delivers && (silent < kLatePeerLimits * limit || !another_rail_progressed_locked(i, s.last_progress)))
          continue;  // a late peer, not a broken path: watched on a while longer
        double ms = std::chrono::duration<double, std::milli>(now - s.last_progress).count();
        // Which rule fired: a starved peer and a broken path differ only in the second.
        stalled.emplace_back(static_cast<int>(i),
                             s.what + " moved no data for " + std::to_string(static_cast<int>(ms)) + " ms (limit " +
                                 std::to_string(static_cast<int>(std::chrono::duration<double, std::milli>(limit).count())) +
                                 " ms; " +
                                 (delivers ? "its connections deliver, but it outlasted twice the limit and no other rail with work was as silent"
                                  : delivering_ ? "data it sent waits for the peer's acknowledgement"
                                                : "its transport cannot tell whether it delivers") +
                                 ")");
        // Still silent later: report again (rank 0 may have ignored the first report while the
        // rail looked like the last one up).
        s.last_progress = now + kReportAgainAfter * limit;
      }
    }
    if (!stalled.empty() || !lost.empty()) {
      lock.unlock();
      for (const auto& [rail, what] : lost) on_link_lost_(rail, what);
      for (const auto& [rail, what] : stalled) on_stall_(rail, what);
      lock.lock();
      continue;
    }
    idle_ = !watching;
    if (watching) cv_.wait_for(lock, tick);
    else cv_.wait(lock);
  }
}

}  // namespace nezha::engine
