// Engine: the background loop (engine.h says why it looks this way), heartbeats, liveness of
// peers, rank 0's notices and fatal broadcasts.

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace nezha::engine {

using namespace internal;

void Engine::send_heartbeats(Clock::time_point now) {
  if (config_.size < 2 || now - last_sent_ < seconds(kHeartbeatS)) return;
  if (config_.rank == 0) {
    ResponseList beat;
    beat.watermark = watermark();
    beat.round = rounds_->tag();
    std::string bytes = encode(beat);
    for (int peer = 1; peer < config_.size; ++peer)
      if (!peer_shutdown_[peer])
        control_->send(peer, bytes);
  } else {
    RequestList beat;
    if (failover_needed()) beat.completed = executor_->completed();
    control_->send(0, encode(beat));
  }
  last_sent_ = now;
}

void Engine::check_liveness(Clock::time_point now) {
  for (int peer = 0; peer < config_.size; ++peer) {
    if (peer == config_.rank || (config_.rank != 0 && peer != 0) || peer_shutdown_[peer]) continue;
    double silent = std::chrono::duration<double>(now - last_heard_[peer]).count();
    // Heartbeats arrive every second: a longer silence may be a cut cable under the current
    // control path, so try the next one (once per silence) well before giving the rank up.
    if (silent > kSwitchPathAfterS && path_switched_at_[peer] != last_heard_[peer]) {
      path_switched_at_[peer] = last_heard_[peer];
      control_->switch_path(peer, "no message for " + std::to_string(silent).substr(0, 3) + " s");
    }
    if (silent > config_.timeout_s)
      throw TimeoutError(peer, "no message from rank " + std::to_string(peer) + " for " +
                                   std::to_string(static_cast<int>(silent)) +
                                   " s (NEZHA_TIMEOUT_S): it is stopped, hung or unreachable");
  }
  // (A cache-round vector lost under a cut between two workers needs nothing here: it stays
  // unacknowledged, and the control channel's ack timeout moves that peer to the next path.)
  std::vector<int> late = rounds_->late_ranks(now, config_.timeout_s);
  if (!late.empty()) {
    std::string who;
    for (int r : late) who += (who.empty() ? "" : ",") + std::to_string(r);
    throw TimeoutError(late[0], "cache round " + std::to_string(rounds_->completed() + 1) +
                                    ": no vector from rank(s) " + who + " within " +
                                    std::to_string(static_cast<int>(config_.timeout_s)) +
                                    " s (NEZHA_TIMEOUT_S)");
  }
}

void Engine::send_notices(std::vector<std::string> notices) {
  // Out of band: a notice is logged on arrival, never executed, so it needs no place in the order.
  if (notices.empty() || config_.size < 2) return;
  ResponseList list;
  list.notices = std::move(notices);
  std::string bytes = encode(list);
  for (int peer = 1; peer < config_.size; ++peer)
    if (!peer_shutdown_[peer]) control_->send(peer, bytes);
}

void Engine::broadcast_fatal(const std::string& reason) {
  // Best effort: tell the surviving workers why before closing, so every rank names the culprit.
  ResponseList list;
  list.fatal = reason;
  std::string bytes = encode(list);
  for (int peer = 1; peer < config_.size; ++peer) {
    try {
      control_->send(peer, bytes);
    } catch (const std::exception&) {
    }
  }
}

void Engine::loop() {
  name_this_thread("nz-engine");
  std::unique_lock<std::mutex> lock(loop_mu_);
  while (!finished_) {
    loop_pass([&](int timeout_ms) {
      const uint64_t leads_before = leads_;
      loop_sleeps_until_ = Clock::now() + std::chrono::milliseconds(timeout_ms);
      lock.unlock();
      epoll_event ev[2];
      ::epoll_wait(loop_epoll_, ev, 2, timeout_ms);  // EINTR: as a timeout
      lock.lock();
      return leads_ != leads_before;  // a caller led meanwhile: recompute everything
    }, /*leader=*/false);
  }
}

Clock::time_point Engine::next_wakeup(Clock::time_point now) const {
  Clock::time_point until = now + seconds(std::min(kIdleWakeS, kHeartbeatS));
  if (coordinator_)
    if (auto t = coordinator_->next_wakeup(now)) until = std::min(until, *t);
  if (failover_)
    if (auto t = failover_->next_wakeup()) until = std::min(until, std::max(now, *t));
  if (auto t = rounds_->next_wakeup(config_.timeout_s, config_.stall_check_s)) until = std::min(until, *t);
  if (shutdown_deadline_) until = std::min(until, *shutdown_deadline_);
  return until;
}

void Engine::loop_pass(const ControlChannel::Wait& wait, bool leader) {
  try {
    forward_new_work();
    handle_local_rail_events();
    Clock::time_point now = Clock::now();
    send_heartbeats(now);
    check_liveness(now);
    if (failover_) apply_decision(failover_->start_due_probes(now));
    warn_round_stalls(now);
    if (config_.rank == 0) {
      dispatch(coordinator_->take_ready(now));
      dispatch(coordinator_->check_stalls(now));
      send_notices(coordinator_->take_notices());
      if (std::all_of(peer_shutdown_.begin(), peer_shutdown_.end(), [](bool b) { return b; })) {
        ResponseList bye;
        bye.shutdown = true;
        std::string bytes = encode(bye);
        for (int peer = 1; peer < config_.size; ++peer)
          control_->send(peer, bytes);
        finished_ = true;
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutdown_requested_ && !shutdown_deadline_)
        shutdown_deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(config_.timeout_s));
    }
    if (shutdown_deadline_ && now >= *shutdown_deadline_) {
      NZ_LOG(Warning) << rank_prefix(config_.rank)
                      << "shutdown: not every rank shut down within " << config_.timeout_s
                      << " s; closing anyway";
      finished_ = true;
      return;
    }
    // Sleep until a control message, new work, or the next timer.
    double wait_s = std::max(0.0, std::chrono::duration<double>(next_wakeup(now) - now).count());
    if (config_.size > 1) {
      try {
        // A leader leaves wake_fd_ alone: what woke it (another caller's work, a shutdown) is the
        // loop thread's to take once the lead ends, and draining it here could lose it.
        auto msg = control_->recv_any(leader ? -1 : wake_fd_, Deadline::after_seconds(wait_s), wait);
        if (msg) on_control_message(msg->peer, msg->payload);
      } catch (const PeerError& e) {
        if (!control_loss_expected(e.peer())) throw;
        NZ_LOG(Debug) << rank_prefix(config_.rank) << "control connection closed: " << e.what();
      }
    } else {
      wait(static_cast<int>(wait_s * 1000) + 1);
    }
    uint64_t drained;
    while (!leader && ::read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
  } catch (const PeerError& e) {
    std::string reason = "rank " + std::to_string(e.peer()) + " is unreachable: " + e.what();
    if (config_.rank == 0) broadcast_fatal(reason);
    fail_everything(reason);
    finished_ = true;
  } catch (const std::exception& e) {
    std::string reason = std::string("engine stopped: ") + e.what();
    if (config_.rank == 0) broadcast_fatal(reason);
    fail_everything(reason);
    finished_ = true;
  }
}

void Engine::lead(const std::vector<std::shared_ptr<OpHandle>>& handles, const std::vector<std::string>& names,
                  double lead_s) {
  std::unique_lock<std::mutex> lock(loop_mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) {  // the loop thread is running a pass (or gone): its job
    wake();
    return;
  }
  ++leads_;
  const int watch = control_->watch_fd();
  // The loop thread sleeps on, unwoken: the connections leave its wait. Muted and unmuted with
  // EPOLL_CTL_MOD: an ADD of the nested epoll set would walk all of its descriptors (the kernel's
  // loop check), O(peers) per operation.
  auto listen_to_watch = [&](uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = watch;
    ::epoll_ctl(loop_epoll_, EPOLL_CTL_MOD, watch, &ev);
  };
  listen_to_watch(0);
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(lead_s));
  // Led until the operations are done, or have left negotiation for the rails (their rail workers
  // complete them; the caller waits on the handles then, as without a lead).
  auto negotiating = [&] {
    if (std::all_of(handles.begin(), handles.end(), [](const auto& h) { return h->poll(); })) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return in_flight_.count(n) > 0; });
  };
  while (!finished_ && negotiating()) {
    const Clock::time_point now = Clock::now();
    if (now >= until) break;
    loop_pass([&](int timeout_ms) {
      // Done within this pass (rank 0 completes its own inline result in dispatch): don't wait.
      if (!negotiating()) return true;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return true;  // the lead is over: end the pass
      epoll_event ev;
      ::epoll_wait(watch, &ev, 1, static_cast<int>(std::min<long long>(left, timeout_ms)));
      return false;
    }, /*leader=*/true);
  }
  listen_to_watch(EPOLLIN);  // readable already: the loop thread wakes
  // The loop thread's wait was planned before this lead: wake it if a timer is now due sooner.
  const Clock::time_point now = Clock::now();
  Clock::time_point due = next_wakeup(now);
  if (auto t = control_->next_timer(now)) due = std::min(due, *t);
  if (finished_ || due < loop_sleeps_until_) wake();
}

}  // namespace nezha::engine
