#include "engine/failover/rail_failover.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace nezha::engine {

RailFailover::RailFailover(int size, std::vector<std::string> rail_names,
                           multirail::RailHealthOptions opt)
    : size_(size) {
  for (auto& n : rail_names) rails_.emplace_back(n, multirail::RailHealth(n, opt));
}

void RailFailover::check(int rail, int rank) const {
  if (rail < 0 || rail >= static_cast<int>(rails_.size()) || rank < 0 || rank >= size_)
    throw ProtocolError("rail event for rail " + std::to_string(rail) + " from rank " +
                        std::to_string(rank) + " is out of range");
}

void RailFailover::start_collecting(Rail& rail) {
  rail.reported.assign(size_, false);
  rail.first_incomplete = std::numeric_limits<uint64_t>::max();
}

bool RailFailover::collect(Rail& rail, int rank) {
  rail.reported[rank] = true;
  return std::all_of(rail.reported.begin(), rail.reported.end(), [](bool b) { return b; });
}

std::vector<bool> RailFailover::usable() const {
  std::vector<bool> out;
  for (const auto& r : rails_) out.push_back(r.phase == Phase::kUp);
  return out;
}

int RailFailover::num_usable() const {
  return static_cast<int>(std::count_if(rails_.begin(), rails_.end(),
                                        [](const Rail& r) { return r.phase == Phase::kUp; }));
}

RailFailover::Decision RailFailover::take_down(int rail, const std::string& why, Clock::time_point now) {
  Rail& r = rails_[rail];
  Decision d;
  r.querying = false;
  r.health.mark_failed(now);
  r.phase = Phase::kDraining;
  start_collecting(r);
  d.broadcast.push_back({RailEventKind::kDown, rail, -1, 0, "rail '" + r.name + "' " + why});
  return d;
}

RailFailover::Decision RailFailover::on_failed(int rail, int rank, const std::string& why,
                                               bool stalled, uint64_t seq, Clock::time_point now) {
  check(rail, rank);
  Rail& r = rails_[rail];
  Decision d;
  switch (r.phase) {
    case Phase::kUp:
      if (num_usable() < 2) {
        if (stalled) return d;
        d.fatal = "rail '" + r.name + "' failed on rank " + std::to_string(rank) +
                  " and no other rail is up: " + why;
        return d;
      }
      if (!stalled) return take_down(rail, "failed on rank " + std::to_string(rank) + ": " + why, now);
      // One check at a time (a stall that goes on is reported again), unless this stall is in an
      // earlier operation: check that one instead (see the header).
      if (r.querying && seq >= r.query_seq) return d;
      r.querying = true;
      r.query_seq = seq;
      r.query_why = "failed on rank " + std::to_string(rank) + ": " + why;
      start_collecting(r);
      d.broadcast.push_back({RailEventKind::kQuery, rail, -1, seq, ""});
      return d;
    case Phase::kResetting:
    case Phase::kConnecting:
      r.health.probe_failed(now);
      r.phase = Phase::kDown;
      d.broadcast.push_back({RailEventKind::kProbeFailed, rail, -1, 0,
                             "rank " + std::to_string(rank) + ": " + why});
      return d;
    default:
      return d;  // already down: several shares report the same failure
  }
}

RailFailover::Decision RailFailover::on_query_reply(int rail, int rank, uint64_t seq, bool behind,
                                                    Clock::time_point now) {
  check(rail, rank);
  Rail& r = rails_[rail];
  if (r.phase != Phase::kUp || !r.querying || seq != r.query_seq) return {};
  if (behind) {
    r.querying = false;  // a late rank, not a dead rail
    return {};
  }
  if (!collect(r, rank)) return {};
  if (num_usable() < 2) {  // another rail went down meanwhile: this one is all that is left
    r.querying = false;
    return {};
  }
  return take_down(rail, r.query_why, now);
}

RailFailover::Decision RailFailover::on_drained(int rail, int rank, uint64_t completed,
                                                const std::vector<multirail::RailEstimate>& estimates) {
  check(rail, rank);
  Rail& r = rails_[rail];
  Decision d;
  if (r.phase != Phase::kDraining) return d;
  r.first_incomplete = std::min(r.first_incomplete, completed);
  if (!collect(r, rank)) return d;
  // The redo goes to the fastest rail still up (highest bandwidth; the lowest index if unknown).
  int target = -1;
  double best = -1;
  for (size_t i = 0; i < rails_.size(); ++i) {
    if (rails_[i].phase != Phase::kUp) continue;
    if (i < redo_targets_.size() && !redo_targets_[i]) continue;
    double beta = i < estimates.size() ? estimates[i].beta_gbps : 0;
    if (target < 0 || beta > best) {
      target = static_cast<int>(i);
      best = beta;
    }
  }
  r.phase = Phase::kDown;
  if (target < 0) {
    d.fatal = "rail '" + r.name + "' failed and no other rail is up to take over its work";
    return d;
  }
  d.broadcast.push_back({RailEventKind::kRedo, rail, target, r.first_incomplete, ""});
  return d;
}

RailFailover::Decision RailFailover::start_due_probes(Clock::time_point now) {
  Decision d;
  for (size_t i = 0; i < rails_.size(); ++i) {
    Rail& r = rails_[i];
    if (r.phase != Phase::kDown || !r.health.probe_due(now)) continue;
    r.health.begin_probe(now);
    r.phase = Phase::kResetting;
    start_collecting(r);
    d.broadcast.push_back({RailEventKind::kProbe, static_cast<int>(i), -1, 0, ""});
  }
  return d;
}

RailFailover::Decision RailFailover::on_probe_ready(int rail, int rank) {
  check(rail, rank);
  Rail& r = rails_[rail];
  Decision d;
  if (r.phase != Phase::kResetting || !collect(r, rank)) return d;
  r.phase = Phase::kConnecting;
  start_collecting(r);
  d.broadcast.push_back({RailEventKind::kConnect, rail, -1, 0, ""});
  return d;
}

RailFailover::Decision RailFailover::on_probe_result(int rail, int rank, bool ok,
                                                     const std::string& why, Clock::time_point now) {
  check(rail, rank);
  Rail& r = rails_[rail];
  Decision d;
  if (r.phase != Phase::kConnecting) return d;
  if (!ok) {
    r.health.probe_failed(now);
    r.phase = Phase::kDown;
    d.broadcast.push_back({RailEventKind::kProbeFailed, rail, -1, 0,
                           "rank " + std::to_string(rank) + ": " + why});
    return d;
  }
  if (!collect(r, rank)) return d;
  r.health.probe_succeeded(now);
  r.phase = Phase::kUp;
  d.broadcast.push_back({RailEventKind::kUp, rail, -1, 0, ""});
  return d;
}

std::optional<Clock::time_point> RailFailover::next_wakeup() const {
  std::optional<Clock::time_point> t;
  for (const auto& r : rails_)
    if (r.phase == Phase::kDown && (!t || r.health.next_probe_at() < *t)) t = r.health.next_probe_at();
  return t;
}

}  // namespace nezha::engine
