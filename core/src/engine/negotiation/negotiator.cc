// Negotiator: routing new work, rank 0's dispatch and plans, the ordered response stream, and the
// control messages that arrive.
#include "engine/negotiation/negotiator.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "engine/negotiation/control_inline.h"
#include "engine/negotiation/fusion.h"

namespace nezha::engine {

Negotiator::Negotiator(NegotiatorOptions opt, ControlChannel& control, multirail::RailTable& table,
                       Submissions& submissions, const ProcessSetTable& process_sets, Timeline& timeline,
                       NegotiatorLinks links)
    : opt_(std::move(opt)),
      control_(control),
      table_(table),
      submissions_(submissions),
      process_sets_(process_sets),
      timeline_(timeline),
      links_(std::move(links)) {
  if (opt_.rank == 0) coordinator_ = std::make_unique<Coordinator>(opt_.coordinator);
  else table_.report_operations_to_coordinator();  // with each message to rank 0 (StripingCheck)
  rounds_ = std::make_unique<CacheRounds>(opt_.rounds);
  peer_shutdown_.assign(opt_.size, false);
  last_heard_.assign(opt_.size, Clock::now());
  path_switched_at_.assign(opt_.size, Clock::time_point{});
  last_sent_ = Clock::now();
}

NegotiatorStats Negotiator::stats() const {
  NegotiatorStats s;
  s.tensors_via_rounds = tensors_via_rounds_;
  s.tensors_via_coordinator = tensors_via_coordinator_;
  s.tensors_done_by_coordinator = tensors_done_by_coordinator_;
  s.operations_on_rails = operations_on_rails_;
  s.requests_to_coordinator = requests_to_coordinator_;
  s.rounds = rounds_completed_;
  return s;
}

void Negotiator::forward_new_work() {
  route_new_work();
  pump_rounds();
}

void Negotiator::route_new_work() {
  RequestList list;
  const Clock::time_point now = Clock::now();
  size_t inline_budget = kControlInlineBytesPerMessage;  // inline inputs this request list may carry
  const bool shutdown = submissions_.drain_new([&](const std::string& name, const TensorEntry& entry) {
    const Request& req = entry.req;
    CacheRounds::Decision d = rounds_->route(req);
    if (d.route == CacheRounds::Route::kRound) {
      rounds_->add_pending(d.id, now);  // agreed in a cache round, not by rank 0
      return;
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
    if (opt_.size > 1 && wants_inline_input(req, opt_.control_inline_bytes, opt_.rank, opt_.size) &&
        req.bytes() <= inline_budget) {
      list.requests.back().inline_input.assign(static_cast<const char*>(entry.input), req.bytes());
      inline_budget -= req.bytes();
    }
  });
  bool send_shutdown = false;
  if (shutdown && !shutdown_sent_) send_shutdown = shutdown_sent_ = true;
  requests_to_coordinator_ += list.requests.size();
  if (!list.requests.empty() || send_shutdown) send_requests(std::move(list), send_shutdown);
}

void Negotiator::send_requests(RequestList list, bool send_shutdown) {
  if (opt_.rank == 0) {
    coordinator_->submit(0, std::move(list.requests), Clock::now());
    if (send_shutdown) peer_shutdown_[0] = true;
  } else {
    list.shutdown = send_shutdown;
    list.completed = links_.completed();
    list.operation_times = table_.take_operation_times();
    control_.send(0, encode(list));
    last_sent_ = Clock::now();
  }
}

void Negotiator::send_rail_events(std::vector<RailEvent> events) {
  RequestList list;
  list.rail_events = std::move(events);
  list.completed = links_.completed();
  list.operation_times = table_.take_operation_times();
  control_.send(0, encode(list));
  last_sent_ = Clock::now();
}

void Negotiator::broadcast_in_order(std::vector<RailEvent> events) {
  ResponseList list;
  list.rail_events = std::move(events);
  send_in_order(std::move(list));
}

bool Negotiator::coordinate(Clock::time_point now) {
  if (opt_.rank != 0) return false;
  coordinator_->set_rail_estimates(table_.estimates());
  dispatch(coordinator_->take_ready(now));
  dispatch(coordinator_->check_stalls(now));
  send_notices(coordinator_->take_notices());
  if (!std::all_of(peer_shutdown_.begin(), peer_shutdown_.end(), [](bool b) { return b; })) return false;
  ResponseList bye;
  bye.shutdown = true;
  std::string bytes = encode(bye);
  for (int peer = 1; peer < opt_.size; ++peer) control_.send(peer, bytes);
  return true;
}

int Negotiator::requests_awaited() const {
  if (opt_.rank != 0 || rounds_->enabled() || !held_dispatch_.empty()) return 1;
  return coordinator_->fewest_requests_missing();
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

std::vector<multirail::RailShare> Negotiator::plan_for(const Response& r) {
  if (r.kind != Response::Kind::kExecute) return {};
  multirail::OpToPlan op;
  op.count = planned_elements(r);
  op.elem_size = dtype_size(r.dtype);
  // Every collective that moves data is striped (execution/striped_part_task.cc for all but allreduce); a
  // collective rail takes shares only of allreduces of every rank it reduces, and runs whole a
  // broadcast, allgather, reducescatter or alltoall of every rank it runs (shared memory does; aggregation
  // not).
  op.splittable = op.count > 0 && r.type != OpType::kBarrier && r.type != OpType::kJoin;
  op.allreduce = r.type == OpType::kAllreduce && r.process_set == 0;
  if (r.process_set == 0) {
    switch (r.type) {
      case OpType::kBroadcast: op.other = multirail::RailOp::kBroadcast; break;
      case OpType::kAllgather: op.other = multirail::RailOp::kAllgather; break;
      case OpType::kReducescatter: op.other = multirail::RailOp::kReducescatter; break;
      case OpType::kAlltoall: op.other = multirail::RailOp::kAlltoall; break;
      default: break;
    }
  }
  op.dtype = r.dtype;
  op.op = r.op;
  multirail::Plan plan = table_.plan(op, multirail::PlanSource::kNegotiation, {}, [this](int rail, size_t bytes) {
    NZ_LOG(Debug) << me() << "probing rail '" << opt_.rail_names[rail] << "' with " << bytes << " bytes";
  });
  if (op.splittable && opt_.rail_names.size() > 1) {
    const size_t bytes = op.count * op.elem_size;
    if (plan.striped != last_plan_striped_) {
      NZ_LOG(Debug) << me() << (plan.striped ? "cold -> hot" : "hot -> cold") << " at " << bytes
                    << " bytes: " << plan.why;
      last_plan_striped_ = plan.striped;
    }
    if (log_level() <= LogLevel::kTrace) {
      std::ostringstream os;
      for (const auto& sh : plan.shares) os << " rail" << sh.rail << "=" << sh.count;
      NZ_LOG(Trace) << me() << "plan " << bytes << " B:" << os.str() << " (" << plan.why << ")";
    }
  }
  return plan.shares;
}

void Negotiator::dispatch(std::vector<Response> responses) {
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
  if (opt_.rail_names.size() > 1) list.estimates = table_.estimates();
  send_in_order(std::move(list));
}

void Negotiator::send_in_order(ResponseList list) {
  list.watermark = links_.watermark();
  list.round = rounds_->tag();
  std::string bytes = encode(list);
  for (int peer = 1; peer < opt_.size; ++peer) control_.send(peer, bytes);
  last_sent_ = Clock::now();
  rounds_->hold(std::move(list));  // rank 0 executes it in the same place as every other rank
  pump_rounds();
}

bool Negotiator::on_control_message(int peer, const std::string& payload) {
  last_heard_[peer] = Clock::now();
  if (is_round_message(payload)) {
    RoundMessage msg = decode_round_message(payload);
    if (opt_.rank == 0) table_.observe_rank_operations(peer, msg.operation_times);
    rounds_->receive(peer, std::move(msg));
    pump_rounds();
    return false;
  }
  if (opt_.rank == 0) {
    RequestList list = decode_request_list(payload);
    links_.completed_from(peer, list.completed);
    table_.observe_rank_operations(peer, list.operation_times);
    coordinator_->submit(peer, std::move(list.requests), Clock::now());
    if (!list.rail_events.empty()) links_.rail_events_from(peer, list.rail_events);
    if (list.shutdown) peer_shutdown_[peer] = true;
    return false;
  }
  if (peer != 0) throw ProtocolError("rank " + std::to_string(peer) + " sent a response list; only rank 0 does");
  ResponseList list = decode_response_list(payload);
  for (const auto& n : list.notices) NZ_LOG(Warning) << me() << n;
  if (list.is_notice_only()) return false;
  if (!list.fatal.empty()) {
    links_.fail(list.fatal);
    return true;
  }
  bool bye = list.shutdown;
  rounds_->hold(std::move(list));  // executed after the round it is tagged with
  pump_rounds();
  return bye;
}

}  // namespace nezha::engine
