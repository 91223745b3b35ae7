// The engine's cache-round hooks (negotiation/cache_rounds.h has the protocol and the ordering
// argument): kept apart from engine.cc so the loop there only calls in.
#include <optional>

#include "common/error.h"
#include "common/logging.h"
#include "engine/engine.h"

namespace nezha::engine {
namespace {

std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace

void Engine::pump_rounds() {
  // Re-entered from what it executes (requeue -> forward_new_work, rank 0's dispatch): the outer
  // call carries on, so steps stay in order.
  if (pumping_) return;
  pumping_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{pumping_};
  for (;;) {
    if (rounds_->round_due()) {
      // Answer with everything submitted so far: a tensor enqueued a moment ago would otherwise
      // miss this round and cost another one.
      route_new_work();
      std::vector<multirail::RailEstimate> est;
      if (config_.rank == 0 && rails_.size() > 1) est = current_estimates();
      send_round(rounds_->start_round(Clock::now(), std::move(est)));
      continue;
    }
    std::optional<RoundStep> step = rounds_->next();
    if (!step) break;
    if (step->responses) execute_locally(*step->responses);
    else execute_round(*step->round);
  }
}

void Engine::execute_round(RoundOutcome& outcome) {
  ResponseList list;
  list.estimates = outcome.estimates;
  for (auto& op : outcome.ops) {
    // Every rank plans from rank 0's estimates in this round's vector and from the rails' states as
    // of this point of the total order (rail events travel in rank 0's lists): the same split
    // everywhere.
    multirail::OpToPlan plan_op;
    for (int64_t c : op.counts) plan_op.count += static_cast<size_t>(c);
    plan_op.elem_size = dtype_size(op.dtype);
    plan_op.splittable = op.kind == Response::Kind::kExecute && op.type == OpType::kAllreduce;
    plan_op.allreduce = plan_op.splittable && op.process_set == 0;
    plan_op.dtype = op.dtype;
    plan_op.op = op.op;
    op.plan = plan_op.splittable
                  ? rail_table_->plan(plan_op, multirail::PlanSource::kRound, outcome.estimates).shares
                  : std::vector<multirail::RailShare>{};
    list.responses.push_back(std::move(op));
  }
  ++rounds_completed_;
  execute_locally(list, /*from_round=*/true);
  if (!outcome.requeue.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& name : outcome.requeue) {
      NZ_LOG(Debug) << rank_prefix(config_.rank) << "tensor '" << name
                    << "' was re-submitted with other metadata: negotiating it with rank 0";
      new_names_.push_back(std::move(name));
    }
  }
  if (!outcome.requeue.empty()) forward_new_work();
  if (coordinator_ && !held_dispatch_.empty()) dispatch({});  // a join may go out now
}

void Engine::send_round(const RoundMessage& msg) {
  std::string bytes = encode(msg);
  for (int peer = 0; peer < config_.size; ++peer) {
    if (peer == config_.rank) continue;
    try {
      control_->send(peer, bytes);
    } catch (const PeerError& e) {
      if (!control_loss_expected(e.peer())) throw;
    }
  }
  last_sent_ = Clock::now();
}

bool Engine::control_loss_expected(int peer) const {
  // A rank that already said goodbye may close. Worker-to-worker connections carry cache rounds:
  // losing one is losing a rank, unless this rank is shutting down too (the goodbye from rank 0,
  // after which peers close, comes only once every rank has asked to shut down).
  if (config_.rank == 0) return peer_shutdown_[peer];
  return peer != 0 && (!rounds_->enabled() || shutdown_sent_);
}

void Engine::warn_round_stalls(Clock::time_point now) {
  for (const auto& s : rounds_->check_stalls(now, config_.stall_check_s)) {
    std::string who;
    for (int r : s.missing_ranks) who += (who.empty() ? "" : ",") + std::to_string(r);
    NZ_LOG(Warning) << rank_prefix(config_.rank) << "stall: cached tensor '" << s.name
                    << "' was submitted " << static_cast<int>(s.age_s) << " s ago but "
                    << (who.empty() ? "no cache round has completed since"
                                    : "the last cache round lacked it from rank(s) " + who);
  }
}

}  // namespace nezha::engine
