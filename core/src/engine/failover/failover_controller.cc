#include "engine/failover/failover_controller.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"

namespace nezha::engine {
namespace {

constexpr size_t kProbeBytes = size_t{1} << 20;  // test allreduce of a re-admitted rail (a beta sample)
constexpr double kProbeConnectS = 1.0;            // a rail whose link is still down fails this fast

std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace

FailoverController::FailoverController(FailoverOptions opt, std::vector<transport::Rail*> rails,
                                       multirail::RailTable& table, RailWork work, FailoverLinks links)
    : opt_(std::move(opt)), rails_(std::move(rails)), table_(table), work_(std::move(work)), links_(std::move(links)) {
  failure_reported_.assign(rails_.size(), false);
  if (opt_.enabled && opt_.rank == 0) {
    std::vector<std::string> names;
    for (const auto* r : rails_) names.push_back(r->properties().name);
    failover_ = std::make_unique<RailFailover>(opt_.size, names, opt_.health);
    if (!opt_.redo_targets.empty()) failover_->set_redo_targets(opt_.redo_targets);
    completed_by_rank_.assign(opt_.size, std::vector<uint64_t>(rails_.size(), 0));
  }
}

std::vector<uint64_t> FailoverController::completed_if_enabled() const {
  return opt_.enabled ? work_.completed() : std::vector<uint64_t>{};
}

std::vector<uint64_t> FailoverController::watermark() const {
  if (!failover_) return {};
  std::vector<uint64_t> w = work_.completed();
  for (int r = 1; r < opt_.size; ++r)
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::min(w[i], completed_by_rank_[r][i]);
  return w;
}

void FailoverController::on_completed_from(int rank, const std::vector<uint64_t>& completed) {
  if (failover_ && completed.size() == rails_.size()) completed_by_rank_[rank] = completed;
}

void FailoverController::report(RailEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reports_.push_back(std::move(event));
  }
  links_.wake();
}

void FailoverController::handle_reports() {
  std::vector<RailEvent> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(reports_);
  }
  if (events.empty()) return;
  std::vector<RailEvent> to_send;
  for (RailEvent& e : events) {
    if (e.kind == RailEventKind::kFailed) {
      std::vector<bool> usable = table_.usable();
      if (!usable[e.rail] || failure_reported_[e.rail]) continue;  // already being handled
      // A stall on the last rail is not a rail failure to act on: the operation's own deadline
      // (NEZHA_TIMEOUT_S) and the liveness checks name whoever is really stuck.
      if (e.value && std::count(usable.begin(), usable.end(), true) < 2) continue;
      // Errors are reported once; stalls once per stalled operation (rank 0 may ignore one).
      if (!e.value) failure_reported_[e.rail] = true;
      links_.avoid_path(e.rail, true);  // the report itself must not go out on the failed rail
      NZ_LOG(Debug) << rank_prefix(opt_.rank) << "rail " << e.rail << " failed here: " << e.text;
    }
    to_send.push_back(std::move(e));
  }
  if (to_send.empty()) return;
  if (opt_.rank == 0)
    on_events_from(0, to_send);
  else
    links_.send_to_coordinator(std::move(to_send));
}

void FailoverController::on_events_from(int rank, const std::vector<RailEvent>& events) {
  if (!failover_) throw ProtocolError("rank " + std::to_string(rank) + " sent a rail event, but this job has one rail");
  Clock::time_point now = Clock::now();
  for (const RailEvent& e : events) {
    switch (e.kind) {
      case RailEventKind::kFailed:
        decide(failover_->on_failed(e.rail, rank, e.text, /*stalled=*/e.value != 0, e.value ? e.value - 1 : 0, now));
        break;
      case RailEventKind::kQueryReply:
        decide(failover_->on_query_reply(e.rail, rank, e.value, e.target != 0, now));
        break;
      case RailEventKind::kDrained:
        decide(failover_->on_drained(e.rail, rank, e.value, table_.estimates()));
        break;
      case RailEventKind::kProbeReady:
        decide(failover_->on_probe_ready(e.rail, rank));
        break;
      case RailEventKind::kProbeResult:
        decide(failover_->on_probe_result(e.rail, rank, e.value != 0, e.text, now));
        break;
      default:
        throw ProtocolError("rank " + std::to_string(rank) + " sent rail event " +
                            std::to_string(static_cast<int>(e.kind)) + ", which only rank 0 sends");
    }
  }
}

void FailoverController::start_due_probes(Clock::time_point now) {
  if (failover_) decide(failover_->start_due_probes(now));
}

std::optional<Clock::time_point> FailoverController::next_wakeup() const {
  if (!failover_) return std::nullopt;
  return failover_->next_wakeup();
}

void FailoverController::decide(RailFailover::Decision d) {
  if (!d.fatal.empty()) throw NezhaError(d.fatal);
  if (!d.broadcast.empty()) broadcast(std::move(d.broadcast));
}

void FailoverController::broadcast(std::vector<RailEvent> events) {
  // The news that a rail is down must not itself travel on that rail.
  for (const RailEvent& e : events)
    if (e.kind == RailEventKind::kDown || e.kind == RailEventKind::kQuery) links_.avoid_path(e.rail, true);
  links_.broadcast_in_order(std::move(events));
}

void FailoverController::apply(const RailEvent& e) {
  const int n = static_cast<int>(rails_.size());
  if (e.rail < 0 || e.rail >= n || (e.kind == RailEventKind::kRedo && (e.target < 0 || e.target >= n)))
    throw ProtocolError("rail event names rail " + std::to_string(e.rail) + " of " + std::to_string(n));
  const int r = e.rail;
  auto set_state = [&](multirail::RailState s) { table_.set_state(r, s); };
  switch (e.kind) {
    case RailEventKind::kDown: {
      set_state(multirail::RailState::kDown);
      std::ostringstream others;
      for (int i = 0; i < n; ++i)
        if (table_.state(i) == multirail::RailState::kUp)
          others << (others.tellp() > 0 ? ", '" : "'") << rail_name(i) << "'";
      // The one line a user sees: the job itself goes on.
      NZ_LOG(Warning) << rank_prefix(opt_.rank) << e.text << "; continuing on " << others.str();
      rails_[r]->abort(e.text);
      links_.avoid_path(r, true);
      work_.post_task(r, [this, r] {
        // Runs after every share posted on the rail so far has failed or finished.
        report({RailEventKind::kDrained, r, -1, work_.completed()[r], ""});
      });
      break;
    }
    case RailEventKind::kRedo:
      work_.redo(r, e.value, e.target);
      break;
    case RailEventKind::kQuery: {
      // Behind: this rank has neither finished the stalled operation nor started it.
      const uint64_t seq = e.value;
      // The rail is suspect: answer (and talk from now on) over another rail's control path, or a
      // cut cable under this rank would swallow the answer.
      links_.avoid_path(r, true);
      bool behind = work_.completed()[r] <= seq && work_.running(r) != seq + 1;
      report({RailEventKind::kQueryReply, r, behind ? 1 : 0, seq, ""});
      break;
    }
    case RailEventKind::kProbe:
      set_state(multirail::RailState::kProbing);
      work_.post_task(r, [this, r] {
        rails_[r]->reset();
        report({RailEventKind::kProbeReady, r, -1, 0, ""});
      });
      break;
    case RailEventKind::kConnect: {
      std::vector<std::string> column;
      for (const auto& addrs : opt_.rail_addrs_by_rank) column.push_back(addrs.at(static_cast<size_t>(r)));
      work_.post_probe(
          r, kProbeBytes, [this, r, column] { rails_[r]->connect(column, Deadline::after_seconds(kProbeConnectS)); },
          [this, r](const std::string& error) {
            report({RailEventKind::kProbeResult, r, -1, error.empty() ? 1u : 0u, error});
          });
      break;
    }
    case RailEventKind::kProbeFailed:
      set_state(multirail::RailState::kDown);
      // Rank 0 alone tells the user: the reason (which rank, which peer, what timed out) is the same
      // text on every rank.
      if (opt_.rank == 0)
        NZ_LOG(Info) << rank_prefix(opt_.rank) << "rail '" << rail_name(r) << "' is still down: " << e.text;
      else
        NZ_LOG(Debug) << rank_prefix(opt_.rank) << "rail '" << rail_name(r) << "' is still down: " << e.text;
      rails_[r]->abort("re-admission failed: " + e.text);
      break;
    case RailEventKind::kUp:
      set_state(multirail::RailState::kUp);
      failure_reported_[r] = false;
      links_.avoid_path(r, false);
      NZ_LOG(Info) << rank_prefix(opt_.rank) << "rail '" << rail_name(r) << "' is back up";
      break;
    default:
      throw ProtocolError("rank 0 sent rail event " + std::to_string(static_cast<int>(e.kind)) +
                          ", which only workers send");
  }
}

}  // namespace nezha::engine
