// Engine: the background loop (engine.h says why it looks this way) and a caller leading it. Each
// pass calls into the components; what the pass does is theirs.

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

namespace nezha::engine {

using namespace internal;

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
  Clock::time_point until = std::min(now + seconds(kIdleWakeS), negotiator_->next_wakeup(now));
  if (auto t = failover_->next_wakeup()) until = std::min(until, std::max(now, *t));
  if (shutdown_deadline_) until = std::min(until, *shutdown_deadline_);
  return until;
}

void Engine::loop_pass(const ControlChannel::Wait& wait, bool leader) {
  try {
    negotiator_->forward_new_work();
    failover_->handle_reports();
    Clock::time_point now = Clock::now();
    negotiator_->send_heartbeats(now);
    negotiator_->check_liveness(now);
    failover_->start_due_probes(now);
    negotiator_->warn_round_stalls(now);
    if (negotiator_->coordinate(now)) {  // every rank has shut down
      finished_ = true;
      return;
    }
    if (submissions_.shutdown_requested() && !shutdown_deadline_)
      shutdown_deadline_ = now + seconds(config_.timeout_s);
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
        // A caller leading rank 0 for its own operation sleeps until the last request it lacks
        // can have come, not once per request (MessagePath::wake_after_messages): with more ranks
        // than cores each wake-up costs a core. Only while it leads: the lead is bounded (lead_s),
        // and what else a message may bring (a rail event) waits for it at most that long.
        struct WakeAfter {
          ControlChannel& channel;
          ~WakeAfter() { channel.wake_after_messages(1); }
        } reset{*control_};
        if (leader) control_->wake_after_messages(negotiator_->requests_awaited());
        // A leader leaves wake_fd_ alone: what woke it (another caller's work, a shutdown) is the
        // loop thread's to take once the lead ends, and draining it here could lose it.
        auto msg = control_->recv_any(leader ? -1 : wake_fd_, Deadline::after_seconds(wait_s), wait);
        if (msg && negotiator_->on_control_message(msg->peer, msg->payload)) finished_ = true;
        // The rest of what that wake-up brought, in this pass: rank 0 of a star gets an
        // operation's n - 1 requests at once (wake_after_messages), and a pass per message would
        // repeat the pass's other work n times per operation.
        while (msg && !finished_ && (msg = control_->take_ready()))
          if (negotiator_->on_control_message(msg->peer, msg->payload)) finished_ = true;
      } catch (const PeerError& e) {
        if (!negotiator_->control_loss_expected(e.peer())) throw;
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
    negotiator_->broadcast_fatal(reason);
    fail_everything(reason);
    finished_ = true;
  } catch (const std::exception& e) {
    std::string reason = std::string("engine stopped: ") + e.what();
    negotiator_->broadcast_fatal(reason);
    fail_everything(reason);
    finished_ = true;
  }
}

bool Engine::spin_for_control() {
  if (!control_spins_) return false;
  // Where the answer keeps missing the window (a loaded host: the ranks that produce it wait for a
  // core), spinning only takes CPU from them: after a few misses in a row, sleep at once for a while.
  if (spin_skips_ > 0) {
    --spin_skips_;
    return false;
  }
  const Clock::time_point until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(config_.control_spin_us));
  bool found = false;
  do {
    found = control_->readable_now();
    if (found) break;
    ::sched_yield();
  } while (Clock::now() < until);
  found = found || control_->readable_now();
  spin_misses_ = found ? 0 : spin_misses_ + 1;
  if (spin_misses_ >= kSpinMissesBeforeBackoff) {
    spin_misses_ = 0;
    spin_skips_ = kSpinBackoffWaits;
  }
  return found;
}

void Engine::lead(const std::vector<std::shared_ptr<OpHandle>>& handles, const std::vector<std::string>& names,
                  double lead_s, bool waits_to_end) {
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
  if (waits_to_end) executor_->begin_caller_lead();
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(lead_s));
  // Led until the operations are done, or have left negotiation for the rails (their rail workers
  // complete them; the caller waits on the handles then, as without a lead), or something woke the
  // loop thread (another caller's work, a failover report, shutdown): that is the loop thread's to
  // take, and it cannot while this caller holds the loop, so the lead ends at once rather than
  // making it wait out lead_s.
  auto all_done = [&] { return std::all_of(handles.begin(), handles.end(), [](const auto& h) { return h->poll(); }); };
  auto negotiating = [&] { return !all_done() && submissions_.any_in_flight(names); };
  bool woken = false;
  while (!finished_ && !woken && negotiating()) {
    const Clock::time_point now = Clock::now();
    if (now >= until) break;
    loop_pass([&](int timeout_ms) {
      // Done within this pass (rank 0 completes its own inline result in dispatch): don't wait.
      if (!negotiating()) return true;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return true;  // the lead is over: end the pass
      // The answer through shared memory usually comes within tens of microseconds: looking for it
      // (and yielding the CPU to the ranks that produce it) costs less than sleeping and being woken.
      if (spin_for_control()) return false;  // read without blocking
      epoll_event ev[2];
      const int n = ::epoll_wait(lead_epoll_, ev, 2, static_cast<int>(std::min<long long>(left, timeout_ms)));
      for (int i = 0; i < n; ++i) woken = woken || ev[i].data.fd == wake_fd_;
      return woken;
    }, /*leader=*/true);
  }
  const std::vector<int> held = executor_->end_caller_lead();
  listen_to_watch(EPOLLIN);  // readable already: the loop thread wakes
  // The loop thread's wait was planned before this lead: wake it if a timer is now due sooner.
  const Clock::time_point now = Clock::now();
  Clock::time_point due = next_wakeup(now);
  if (auto t = control_->next_timer(now)) due = std::min(due, *t);
  if (finished_ || due < loop_sleeps_until_) wake();
  lock.unlock();
  // What left negotiation as one rail's task waits for this thread (Executor::begin_caller_lead).
  executor_->run_held_here(held, all_done);
}

}  // namespace nezha::engine
