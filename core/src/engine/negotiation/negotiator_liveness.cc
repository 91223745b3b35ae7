// Negotiator: keeping the control channel alive and the peers watched (heartbeats, liveness, a
// path switch under a silent peer), rank 0's notices and fatal broadcasts, and the timers.
#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "engine/negotiation/negotiator.h"

namespace nezha::engine {
namespace {
Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

void Negotiator::send_heartbeats(Clock::time_point now) {
  if (opt_.size < 2 || now - last_sent_ < seconds(kHeartbeatS)) return;
  if (opt_.rank == 0) {
    ResponseList beat;
    beat.watermark = links_.watermark();
    beat.round = rounds_->tag();
    std::string bytes = encode(beat);
    for (int peer = 1; peer < opt_.size; ++peer)
      if (!peer_shutdown_[peer]) control_.send(peer, bytes);
  } else {
    RequestList beat;
    beat.completed = links_.completed();
    control_.send(0, encode(beat));
  }
  last_sent_ = now;
}

void Negotiator::check_liveness(Clock::time_point now) {
  if (now - liveness_checked_at_ < std::chrono::duration<double>(kLivenessCheckS)) return;
  liveness_checked_at_ = now;
  // Rank 0 hears from every rank; a worker only from rank 0 (one check, not a walk over the job).
  const int first = opt_.rank == 0 ? 1 : 0, end = opt_.rank == 0 ? opt_.size : std::min(opt_.size, 1);
  for (int peer = first; peer < end; ++peer) {
    if (peer_shutdown_[peer]) continue;
    double silent = std::chrono::duration<double>(now - last_heard_[peer]).count();
    // Heartbeats arrive every second: a longer silence may be a cut cable under the current
    // control path, so try the next one (once per silence) well before giving the rank up.
    if (silent > kSwitchPathAfterS && path_switched_at_[peer] != last_heard_[peer]) {
      path_switched_at_[peer] = last_heard_[peer];
      control_.switch_path(peer, "no message for " + std::to_string(silent).substr(0, 3) + " s");
    }
    if (silent > opt_.timeout_s)
      throw TimeoutError(peer, "no message from rank " + std::to_string(peer) + " for " +
                                   std::to_string(static_cast<int>(silent)) +
                                   " s (NEZHA_TIMEOUT_S): it is stopped, hung or unreachable");
  }
  // (A cache-round vector lost under a cut between two workers needs nothing here: it stays
  // unacknowledged, and the control channel's ack timeout moves that peer to the next path.)
  std::vector<int> late = rounds_->late_ranks(now, opt_.timeout_s);
  if (!late.empty()) {
    std::string who;
    for (int r : late) who += (who.empty() ? "" : ",") + std::to_string(r);
    throw TimeoutError(late[0], "cache round " + std::to_string(rounds_->completed() + 1) +
                                    ": no vector from rank(s) " + who + " within " +
                                    std::to_string(static_cast<int>(opt_.timeout_s)) + " s (NEZHA_TIMEOUT_S)");
  }
}

Clock::time_point Negotiator::next_wakeup(Clock::time_point now) const {
  Clock::time_point until = now + seconds(kHeartbeatS);
  if (coordinator_)
    if (auto t = coordinator_->next_wakeup(now)) until = std::min(until, *t);
  if (auto t = rounds_->next_wakeup(opt_.timeout_s, opt_.stall_check_s)) until = std::min(until, *t);
  return until;
}

void Negotiator::send_notices(std::vector<std::string> notices) {
  // Out of band: a notice is logged on arrival, never executed, so it needs no place in the order.
  if (notices.empty() || opt_.size < 2) return;
  ResponseList list;
  list.notices = std::move(notices);
  std::string bytes = encode(list);
  for (int peer = 1; peer < opt_.size; ++peer)
    if (!peer_shutdown_[peer]) control_.send(peer, bytes);
}

void Negotiator::broadcast_fatal(const std::string& reason) {
  // Best effort: tell the surviving workers why before closing, so every rank names the culprit.
  if (opt_.rank != 0) return;
  ResponseList list;
  list.fatal = reason;
  std::string bytes = encode(list);
  for (int peer = 1; peer < opt_.size; ++peer) {
    try {
      control_.send(peer, bytes);
    } catch (const std::exception&) {
    }
  }
}

}  // namespace nezha::engine
