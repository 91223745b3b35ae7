#include "multirail/rail_health.h"

#include <algorithm>

#include "common/error.h"

namespace nezha::multirail {

const char* rail_state_name(RailState s) {
  switch (s) {
    case RailState::kUp: return "up";
    case RailState::kDown: return "down";
    case RailState::kProbing: return "probing";
  }
  return "invalid";
}

RailHealth::RailHealth(std::string rail_name, RailHealthOptions opt)
    : name_(std::move(rail_name)), opt_(opt) {
  if (opt_.initial_backoff.count() <= 0 || opt_.max_backoff < opt_.initial_backoff ||
      opt_.flap_window.count() < 0)
    throw InvalidArgument("RailHealthOptions for rail " + name_ +
                          ": need 0 < initial_backoff <= max_backoff and flap_window >= 0");
}

void RailHealth::fail(TimePoint now) {
  const bool flapping = failed_before_ && now - last_failure_ <= opt_.flap_window;
  streak_ = flapping ? streak_ + 1 : 1;
  failed_before_ = true;
  last_failure_ = now;
  // initial * 2^(streak-1), capped; doubling stops at the cap so it cannot overflow.
  Clock::duration b = opt_.initial_backoff;
  for (int i = 1; i < streak_ && b < opt_.max_backoff; ++i) b *= 2;
  backoff_ = std::min<Clock::duration>(b, opt_.max_backoff);
  next_probe_at_ = now + backoff_;
  state_ = RailState::kDown;
}

void RailHealth::mark_failed(TimePoint now) {
  if (state_ == RailState::kDown) return;
  fail(now);
}

bool RailHealth::probe_due(TimePoint now) const {
  return state_ == RailState::kDown && now >= next_probe_at_;
}

void RailHealth::require(RailState expected, const char* call) const {
  if (state_ != expected)
    throw InvalidArgument(std::string("RailHealth::") + call + " on rail " + name_ + " in state " +
                          state_name() + " (needs " + rail_state_name(expected) + ")");
}

void RailHealth::begin_probe(TimePoint now) {
  require(RailState::kDown, "begin_probe");
  if (!probe_due(now))
    throw InvalidArgument("RailHealth::begin_probe on rail " + name_ + ": back-off not elapsed");
  state_ = RailState::kProbing;
}

void RailHealth::probe_succeeded(TimePoint now) {
  require(RailState::kProbing, "probe_succeeded");
  state_ = RailState::kUp;
}

void RailHealth::probe_failed(TimePoint now) {
  require(RailState::kProbing, "probe_failed");
  fail(now);
}

}  // namespace nezha::multirail
