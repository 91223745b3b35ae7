// Engine: the negotiation side of the loop. New work goes to rank 0 (or to the cache rounds),
// rank 0 plans each response with the rail table and sends it in order; control messages are
// routed here.

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/negotiation/control_inline.h"
#include "engine/negotiation/fusion.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {

using namespace internal;

void Engine::forward_new_work() {
  route_new_work();
  pump_rounds();
}

void Engine::route_new_work() {
  RequestList list;
  bool send_shutdown = false;
  const Clock::time_point now = Clock::now();
  size_t inline_budget = kControlInlineBytesPerMessage;  // inline inputs this request list may carry
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& name : new_names_) {
      auto it = in_flight_.find(name);
      if (it == in_flight_.end()) continue;
      const Request& req = it->second.req;
      CacheRounds::Decision d = rounds_->route(req);
      if (d.route == CacheRounds::Route::kRound) {
        rounds_->add_pending(d.id, now);  // agreed in a cache round, not by rank 0
        continue;
      }
      if (d.invalidate) rounds_->announce_invalidation(d.id, d.version);
      if (req.type == OpType::kJoin) rounds_->set_joined();
      if (d.route == CacheRounds::Route::kBrief) {
        Request brief;
        brief.name = name;
        brief.cache_id = d.id;
        list.requests.push_back(std::move(brief));
      } else {
        list.requests.push_back(req);
      }
      if (config_.size > 1 && wants_inline_input(req, config_.control_inline_bytes, config_.rank, config_.size) &&
          req.bytes() <= inline_budget) {
        list.requests.back().inline_input.assign(static_cast<const char*>(it->second.input), req.bytes());
        inline_budget -= req.bytes();
      }
    }
    new_names_.clear();
    if (shutdown_requested_ && !shutdown_sent_) send_shutdown = shutdown_sent_ = true;
  }
  requests_to_coordinator_ += list.requests.size();
  if (!list.requests.empty() || send_shutdown) send_requests(std::move(list), send_shutdown);
}

void Engine::send_requests(RequestList list, bool send_shutdown) {
  if (config_.rank == 0) {
    coordinator_->submit(0, std::move(list.requests), Clock::now());
    if (send_shutdown) peer_shutdown_[0] = true;
  } else {
    list.shutdown = send_shutdown;
    if (failover_needed()) list.completed = executor_->completed();
    control_->send(0, encode(list));
    last_sent_ = Clock::now();
  }
}

namespace {
// The elements a plan splits: what the operation moves per rank, about (an allgather's or
// alltoall's blocks differ per rank; each share carries the same fraction of every block).
size_t planned_elements(const Response& r) {
  size_t count = 0;
  switch (r.type) {
    case OpType::kAllgather:  // one tensor or several fused (negotiation/fusion.h)
      return gathered_elements(r);
    case OpType::kAlltoall: {  // every pair's rows; per rank, on average
      for (int64_t rows : r.splits_matrix) count += static_cast<size_t>(rows);
      size_t ranks = 1;
      while (ranks * ranks < r.splits_matrix.size()) ++ranks;
      return count * static_cast<size_t>(r.row_elements.empty() ? 1 : r.row_elements[0]) / ranks;
    }
    default:
      for (int64_t c : r.counts) count += static_cast<size_t>(c);
      return count;
  }
}
}  // namespace

std::vector<multirail::RailShare> Engine::plan_for(const Response& r) {
  if (r.kind != Response::Kind::kExecute) return {};
  multirail::OpToPlan op;
  op.count = planned_elements(r);
  op.elem_size = dtype_size(r.dtype);
  // Every collective that moves data is striped (executor_striped.cc for all but allreduce); a
  // collective-only rail (aggregation) takes shares only of allreduces of every rank it reduces.
  op.splittable = op.count > 0 && r.type != OpType::kBarrier && r.type != OpType::kJoin;
  op.allreduce = r.type == OpType::kAllreduce && r.process_set == 0;
  op.dtype = r.dtype;
  op.op = r.op;
  multirail::Plan plan = rail_table_->plan(op, multirail::PlanSource::kNegotiation, {},
                                           [this](int rail, size_t bytes) {
                                             NZ_LOG(Debug) << rank_prefix(config_.rank) << "probing rail '"
                                                           << rails_[rail]->properties().name << "' with "
                                                           << bytes << " bytes";
                                           });
  if (op.splittable && rails_.size() > 1) {
    const size_t bytes = op.count * op.elem_size;
    if (plan.striped != last_plan_striped_) {
      NZ_LOG(Debug) << rank_prefix(config_.rank) << (plan.striped ? "cold -> hot" : "hot -> cold")
                    << " at " << bytes << " bytes: " << plan.why;
      last_plan_striped_ = plan.striped;
    }
    if (log_level() <= LogLevel::kTrace) {
      std::ostringstream os;
      for (const auto& sh : plan.shares) os << " rail" << sh.rail << "=" << sh.count;
      NZ_LOG(Trace) << rank_prefix(config_.rank) << "plan " << bytes << " B:" << os.str() << " (" << plan.why << ")";
    }
  }
  return plan.shares;
}

void Engine::dispatch(std::vector<Response> responses) {
  // A join response waits for a cache round in which every rank was joined
  // (negotiation/cache_rounds.h), and what follows it waits behind it.
  for (auto& r : responses) held_dispatch_.push_back(std::move(r));
  auto end = held_dispatch_.end();
  if (!rounds_->join_may_complete())
    end = std::find_if(held_dispatch_.begin(), held_dispatch_.end(),
                       [](const Response& r) { return r.type == OpType::kJoin; });
  if (end == held_dispatch_.begin()) return;
  ResponseList list;
  list.responses.assign(std::make_move_iterator(held_dispatch_.begin()), std::make_move_iterator(end));
  held_dispatch_.erase(held_dispatch_.begin(), end);
  spill_inline_results(list.responses);
  for (Response& r : list.responses)
    if (r.inline_result.empty()) r.plan = plan_for(r);
  if (rails_.size() > 1) list.estimates = current_estimates();
  send_in_order(std::move(list));
}

void Engine::send_in_order(ResponseList list) {
  list.watermark = watermark();
  list.round = rounds_->tag();
  std::string bytes = encode(list);
  for (int peer = 1; peer < config_.size; ++peer) control_->send(peer, bytes);
  last_sent_ = Clock::now();
  rounds_->hold(std::move(list));  // rank 0 executes it in the same place as every other rank
  pump_rounds();
}

std::vector<multirail::RailEstimate> Engine::current_estimates() const { return rail_table_->estimates(); }

void Engine::on_control_message(int peer, const std::string& payload) {
  last_heard_[peer] = Clock::now();
  if (is_round_message(payload)) {
    rounds_->receive(peer, decode_round_message(payload));
    pump_rounds();
  } else if (config_.rank == 0) {
    RequestList list = decode_request_list(payload);
    if (failover_ && list.completed.size() == rails_.size()) completed_by_rank_[peer] = list.completed;
    coordinator_->submit(peer, std::move(list.requests), Clock::now());
    if (!list.rail_events.empty()) on_rail_events_from(peer, list.rail_events);
    if (list.shutdown) peer_shutdown_[peer] = true;
  } else {
    if (peer != 0)
      throw ProtocolError("rank " + std::to_string(peer) + " sent a response list; only rank 0 does");
    ResponseList list = decode_response_list(payload);
    for (const auto& n : list.notices) NZ_LOG(Warning) << rank_prefix(config_.rank) << n;
    if (list.is_notice_only()) return;
    if (!list.fatal.empty()) {
      fail_everything(list.fatal);
      finished_ = true;
      return;
    }
    bool bye = list.shutdown;
    rounds_->hold(std::move(list));  // executed after the round it is tagged with
    pump_rounds();
    if (bye) finished_ = true;
  }
}

}  // namespace nezha::engine
