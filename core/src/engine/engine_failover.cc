// Engine: the rail failover wiring (protocol in failover/rail_failover.h). Workers and the watchdog
// queue events; the loop sends them to rank 0, which decides with RailFailover and puts its
// decisions in the ordered response stream; every rank applies them in apply_rail_event().
#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "engine/engine.h"

namespace nezha::engine {
namespace {

constexpr size_t kProbeBytes = size_t{1} << 20;  // test allreduce of a re-admitted rail (a beta sample)
constexpr double kProbeConnectS = 1.0;            // a rail whose link is still down fails this fast

std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace

std::vector<bool> Engine::usable_rails() const { return rail_table_->usable(); }

std::vector<uint64_t> Engine::watermark() const {
  if (!failover_) return {};
  std::vector<uint64_t> w = executor_->completed();
  for (int r = 1; r < config_.size; ++r)
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::min(w[i], completed_by_rank_[r][i]);
  return w;
}

void Engine::report_rail_event(RailEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    local_rail_events_.push_back(std::move(event));
  }
  wake();
}

void Engine::handle_local_rail_events() {
  std::vector<RailEvent> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(local_rail_events_);
  }
  if (events.empty()) return;
  std::vector<RailEvent> to_send;
  for (RailEvent& e : events) {
    if (e.kind == RailEventKind::kFailed) {
      std::vector<bool> usable = usable_rails();
      if (!usable[e.rail] || failure_reported_[e.rail]) continue;  // already being handled
      // A stall on the last rail is not a rail failure to act on: the operation's own deadline
      // (NEZHA_TIMEOUT_S) and the liveness checks name whoever is really stuck.
      if (e.value && std::count(usable.begin(), usable.end(), true) < 2) continue;
      // Errors are reported once; stalls once per stalled operation (rank 0 may ignore one).
      if (!e.value) failure_reported_[e.rail] = true;
      control_->avoid_path(e.rail, true);  // the report itself must not go out on the failed rail
      NZ_LOG(Debug) << rank_prefix(config_.rank) << "rail " << e.rail << " failed here: " << e.text;
    }
    to_send.push_back(std::move(e));
  }
  if (to_send.empty()) return;
  if (config_.rank == 0) {
    on_rail_events_from(0, to_send);
    return;
  }
  RequestList list;
  list.rail_events = std::move(to_send);
  list.completed = executor_->completed();
  control_->send(0, encode(list));
  last_sent_ = Clock::now();
}

void Engine::on_rail_events_from(int rank, const std::vector<RailEvent>& events) {
  if (!failover_) throw ProtocolError("rank " + std::to_string(rank) + " sent a rail event, but this job has one rail");
  Clock::time_point now = Clock::now();
  for (const RailEvent& e : events) {
    switch (e.kind) {
      case RailEventKind::kFailed:
        apply_decision(failover_->on_failed(e.rail, rank, e.text, /*stalled=*/e.value != 0,
                                            e.value ? e.value - 1 : 0, now));
        break;
      case RailEventKind::kQueryReply:
        apply_decision(failover_->on_query_reply(e.rail, rank, e.value, e.target != 0, now));
        break;
      case RailEventKind::kDrained:
        apply_decision(failover_->on_drained(e.rail, rank, e.value, current_estimates()));
        break;
      case RailEventKind::kProbeReady:
        apply_decision(failover_->on_probe_ready(e.rail, rank));
        break;
      case RailEventKind::kProbeResult:
        apply_decision(failover_->on_probe_result(e.rail, rank, e.value != 0, e.text, now));
        break;
      default:
        throw ProtocolError("rank " + std::to_string(rank) + " sent rail event " +
                            std::to_string(static_cast<int>(e.kind)) + ", which only rank 0 sends");
    }
  }
}

void Engine::apply_decision(RailFailover::Decision d) {
  if (!d.fatal.empty()) throw NezhaError(d.fatal);
  if (!d.broadcast.empty()) broadcast_rail_events(std::move(d.broadcast));
}

void Engine::broadcast_rail_events(std::vector<RailEvent> events) {
  // The news that a rail is down must not itself travel on that rail.
  for (const RailEvent& e : events)
    if (e.kind == RailEventKind::kDown || e.kind == RailEventKind::kQuery) control_->avoid_path(e.rail, true);
  ResponseList list;
  list.rail_events = std::move(events);
  send_in_order(std::move(list));
}

void Engine::apply_rail_event(const RailEvent& e) {
  if (e.rail < 0 || e.rail >= static_cast<int>(rails_.size()) ||
      (e.kind == RailEventKind::kRedo && (e.target < 0 || e.target >= static_cast<int>(rails_.size()))))
    throw ProtocolError("rail event names rail " + std::to_string(e.rail) + " of " +
                        std::to_string(rails_.size()));
  const int r = e.rail;
  const std::string& name = rails_[r]->properties().name;
  auto set_state = [&](multirail::RailState s) { rail_table_->set_state(r, s); };
  switch (e.kind) {
    case RailEventKind::kDown: {
      set_state(multirail::RailState::kDown);
      std::ostringstream others;
      for (size_t i = 0; i < rails_.size(); ++i)
        if (rail_table_->state(static_cast<int>(i)) == multirail::RailState::kUp)
          others << (others.tellp() > 0 ? ", '" : "'") << rails_[i]->properties().name << "'";
      // The one line a user sees: the job itself goes on.
      NZ_LOG(Warning) << rank_prefix(config_.rank) << e.text << "; continuing on " << others.str();
      rails_[r]->abort(e.text);
      control_->avoid_path(r, true);
      executor_->post_task(r, [this, r] {
        // Runs after every share posted on the rail so far has failed or finished.
        report_rail_event({RailEventKind::kDrained, r, -1, executor_->completed()[r], ""});
      });
      break;
    }
    case RailEventKind::kRedo:
      executor_->redo(r, e.value, e.target);
      break;
    case RailEventKind::kQuery: {
      // Behind: this rank has neither finished the stalled operation nor started it.
      const uint64_t seq = e.value;
      // The rail is suspect: answer (and talk from now on) over another rail's control path, or a
      // cut cable under this rank would swallow the answer.
      control_->avoid_path(r, true);
      bool behind = executor_->completed()[r] <= seq && executor_->running(r) != seq + 1;
      report_rail_event({RailEventKind::kQueryReply, r, behind ? 1 : 0, seq, ""});
      break;
    }
    case RailEventKind::kProbe:
      set_state(multirail::RailState::kProbing);
      executor_->post_task(r, [this, r] {
        rails_[r]->reset();
        report_rail_event({RailEventKind::kProbeReady, r, -1, 0, ""});
      });
      break;
    case RailEventKind::kConnect: {
      std::vector<std::string> column;
      for (const auto& addrs : addrs_by_rank_) column.push_back(addrs[rails_.size() + r]);
      executor_->post_probe(
          r, kProbeBytes,
          [this, r, column] { rails_[r]->connect(column, Deadline::after_seconds(kProbeConnectS)); },
          [this, r](const std::string& error) {
            report_rail_event({RailEventKind::kProbeResult, r, -1, error.empty() ? 1u : 0u, error});
          });
      break;
    }
    case RailEventKind::kProbeFailed:
      set_state(multirail::RailState::kDown);
      NZ_LOG(Debug) << rank_prefix(config_.rank) << "rail '" << name << "' is still down: " << e.text;
      rails_[r]->abort("re-admission failed: " + e.text);
      break;
    case RailEventKind::kUp:
      set_state(multirail::RailState::kUp);
      failure_reported_[r] = false;
      control_->avoid_path(r, false);
      NZ_LOG(Info) << rank_prefix(config_.rank) << "rail '" << name << "' is back up";
      break;
    default:
      throw ProtocolError("rank 0 sent rail event " + std::to_string(static_cast<int>(e.kind)) +
                          ", which only workers send");
  }
}

}  // namespace nezha::engine
