// Health of one rail, for failover: Up (carries traffic) -> Down (failed; no traffic) -> Probing (a
// probe is in flight) -> Up again, or back to Down with a longer wait before the next probe.
//
// A rail that flaps (fails again soon after coming back) must not keep stalling collectives, so the
// wait before the next probe doubles with every failure within `flap_window` of the previous one,
// from `initial_backoff` up to `max_backoff`; a failure after a quiet period starts again from
// `initial_backoff`. Pure logic: the caller passes the time in, so tests need no sleeping.
// Not thread-safe: one owner (the engine thread) drives it.
#pragma once

#include <chrono>
#include <string>

#include "common/deadline.h"

namespace nezha::multirail {

enum class RailState { kUp, kDown, kProbing };

const char* rail_state_name(RailState s);  // "up", "down", "probing" (as rail_stats() shows them)

struct RailHealthOptions {
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
  std::chrono::milliseconds flap_window{60000};
};

class RailHealth {
 public:
  using TimePoint = Clock::time_point;

  // `rail_name` only serves error messages.
  explicit RailHealth(std::string rail_name, RailHealthOptions opt = {});

  RailState state() const { return state_; }
  const char* state_name() const { return rail_state_name(state_); }
  bool is_usable() const { return state_ == RailState::kUp; }

  // An operation on the rail failed. Up -> Down; in Probing it counts as the probe failing; in Down
  // it is ignored (several operations in flight report the same failure).
  void mark_failed(TimePoint now);
  // Down and the back-off has elapsed: time to try the rail again.
  bool probe_due(TimePoint now) const;
  // The caller starts a probe: Down -> Probing. Throws InvalidArgument unless probe_due(now).
  void begin_probe(TimePoint now);
  // Probing -> Up. Throws InvalidArgument in any other state.
  void probe_succeeded(TimePoint now);
  // Probing -> Down, next probe after a doubled back-off. Throws InvalidArgument unless Probing.
  void probe_failed(TimePoint now);

  TimePoint next_probe_at() const { return next_probe_at_; }  // meaningful while Down
  Clock::duration current_backoff() const { return backoff_; }
  int failures_in_a_row() const { return streak_; }  // failures each within flap_window of the last

 private:
  void fail(TimePoint now);
  void require(RailState expected, const char* call) const;

  std::string name_;
  RailHealthOptions opt_;
  RailState state_ = RailState::kUp;
  int streak_ = 0;
  bool failed_before_ = false;
  TimePoint last_failure_{};
  Clock::duration backoff_{0};
  TimePoint next_probe_at_{};
};

}  // namespace nezha::multirail
