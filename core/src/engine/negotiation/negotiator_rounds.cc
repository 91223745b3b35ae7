// Negotiator: the cache rounds (cache_rounds.h has the protocol and the ordering argument) and the
// execution of what the total order releases.
#include <optional>
#include <utility>

#include "common/error.h"
#include "common/logging.h"
#include "engine/negotiation/negotiator.h"

namespace nezha::engine {

void Negotiator::pump_rounds() {
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
      // With one rail too: they scale the unfused threshold (scaled_unfused_bytes).
      if (opt_.rank == 0) est = table_.estimates();
      RoundMessage msg = rounds_->start_round(Clock::now(), std::move(est));
      if (opt_.rank != 0) msg.operation_times = table_.take_operation_times();
      send_round(std::move(msg));
      continue;
    }
    std::optional<RoundStep> step = rounds_->next();
    if (!step) break;
    if (step->responses) execute_locally(*step->responses);
    else execute_round(*step->round);
  }
}

void Negotiator::execute_round(RoundOutcome& outcome) {
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
    op.plan = plan_op.splittable ? table_.plan(plan_op, multirail::PlanSource::kRound, outcome.estimates).shares
                                 : std::vector<multirail::RailShare>{};
    list.responses.push_back(std::move(op));
  }
  ++rounds_completed_;
  execute_locally(list, /*from_round=*/true);
  if (!outcome.requeue.empty()) {
    for (const auto& name : outcome.requeue)
      NZ_LOG(Debug) << me() << "tensor '" << name
                    << "' was re-submitted with other metadata: negotiating it with rank 0";
    submissions_.requeue(std::move(outcome.requeue));
    forward_new_work();
  }
  if (coordinator_ && !held_dispatch_.empty()) dispatch({});  // a join may go out now
}

void Negotiator::send_round(RoundMessage msg) {
  // Only rank 0 reads the operation times (the striping check); the others get the round alone.
  const std::string with_times = encode(msg);
  const bool has_times = !msg.operation_times.empty();
  msg.operation_times.clear();
  const std::string without_times = has_times ? encode(msg) : std::string();
  for (int peer = 0; peer < opt_.size; ++peer) {
    if (peer == opt_.rank) continue;
    try {
      control_.send(peer, peer == 0 || !has_times ? with_times : without_times);
    } catch (const PeerError& e) {
      if (!control_loss_expected(e.peer())) throw;
    }
  }
  last_sent_ = Clock::now();
}

bool Negotiator::control_loss_expected(int peer) const {
  // A rank that already said goodbye may close. Worker-to-worker connections carry cache rounds:
  // losing one is losing a rank, unless this rank is shutting down too (the goodbye from rank 0,
  // after which peers close, comes only once every rank has asked to shut down).
  if (opt_.rank == 0) return peer_shutdown_[peer];
  return peer != 0 && (!rounds_->enabled() || shutdown_sent_);
}

void Negotiator::warn_round_stalls(Clock::time_point now) {
  for (const auto& s : rounds_->check_stalls(now, opt_.stall_check_s)) {
    std::string who;
    for (int r : s.missing_ranks) who += (who.empty() ? "" : ",") + std::to_string(r);
    NZ_LOG(Warning) << me() << "stall: cached tensor '" << s.name << "' was submitted " << static_cast<int>(s.age_s)
                    << " s ago but "
                    << (who.empty() ? "no cache round has completed since"
                                    : "the last cache round lacked it from rank(s) " + who);
  }
}

}  // namespace nezha::engine
