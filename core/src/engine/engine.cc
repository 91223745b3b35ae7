#include "engine/engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/knobs.h"
#include "common/logging.h"
#include "engine/control_inline.h"
#include "engine/message_codec.h"

namespace nezha::engine {
namespace {

constexpr const char* kJoinName = kJoinTensorName;
constexpr double kIdleWakeS = 1.0;  // the loop re-checks shutdown/stall state at least this often
// Idle ranks exchange an empty control message this often, so a rank that stopped (SIGSTOP, a hung
// host) is told apart from one that has nothing to submit.
constexpr double kHeartbeatS = 1.0;
constexpr double kSwitchPathAfterS = 2.5 * kHeartbeatS;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace

EngineConfig EngineConfig::from_knobs() {
  EngineConfig c;
  c.fusion_threshold = static_cast<size_t>(std::max<int64_t>(0, knob_int("NEZHA_FUSION_THRESHOLD")));
  c.cycle_time_ms = knob_double("NEZHA_CYCLE_TIME_MS");
  c.timeout_s = knob_double("NEZHA_TIMEOUT_S");
  c.connect_timeout_s = knob_double("NEZHA_CONNECT_TIMEOUT_S");
  c.stall_check_s = knob_double("NEZHA_STALL_CHECK_S");
  c.stall_shutdown_s = knob_double("NEZHA_STALL_SHUTDOWN_S");
  c.logstep_max_bytes = static_cast<size_t>(knob_int("NEZHA_LOGSTEP_MAX_BYTES"));
  c.segment_bytes = static_cast<size_t>(std::max<int64_t>(64, knob_int("NEZHA_SEGMENT_BYTES")));
  c.socket_buffer_bytes = static_cast<size_t>(knob_int("NEZHA_SOCKET_BUFFER_BYTES"));
  c.timeline_path = knob_string("NEZHA_TIMELINE");
  c.rail_stall_ms = knob_double("NEZHA_RAIL_STALL_MS");
  c.rail_failover = knob_int("NEZHA_RAIL_FAILOVER") != 0;
  c.cache_rounds = knob_int("NEZHA_CACHE_ROUNDS") != 0;
  // Capped so the largest result fits one control-message string.
  c.control_inline_bytes = static_cast<size_t>(
      std::clamp<int64_t>(knob_int("NEZHA_CONTROL_INLINE_BYTES"), 0, kMaxControlString));
  return c;
}

Engine::Engine(EngineConfig config) : config_(std::move(config)) {
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size)
    throw InvalidArgument("rank " + std::to_string(config_.rank) + " is out of range for size " +
                          std::to_string(config_.size));
  if (config_.rails.empty()) config_.rails.push_back({"lo", "127.0.0.1", "tcp", {}});
  // The control channel has its own connections on every rail's address (or the control address for
  // a rail without one): negotiation never queues behind bulk data, and losing a rail (rail 0
  // included) does not cut it.
  std::vector<ControlPathConfig> paths;
  for (const auto& rc : config_.rails)
    paths.push_back({rc.name, rc.local_addr.empty() ? config_.control_addr : rc.local_addr});
  control_ = std::make_unique<ControlChannel>(paths, config_.secret, config_.rank, config_.size,
                                              config_.socket_buffer_bytes);
  for (size_t i = 0; i < config_.rails.size(); ++i) {
    const RailConfig& rc = config_.rails[i];
    transport::RailSpec spec;
    spec.kind = rc.kind;
    spec.name = rc.name;
    spec.local_addr = rc.local_addr;
    spec.options = rc.options;
    transport::RailContext ctx;
    ctx.rank = config_.rank;
    ctx.size = config_.size;
    ctx.rail_index = static_cast<int>(i);
    ctx.secret = config_.secret;
    ctx.host_id = config_.host_id;
    ctx.socket_buffer_bytes = config_.socket_buffer_bytes;
    rails_.push_back(transport::make_rail(spec, ctx));
  }
  // Two consecutive samples off the model in the same direction count as a real change of
  // speed (a re-shaped or congested link): shares then follow within two large operations.
  multirail::RailCostModelOptions cost_opt;
  cost_opt.shift_run = 2;
  cost_opt.min_samples = 2;
  cost_opt.jump_ratio = 2.0;  // large payloads only reach this model (SplitRegimeModel)
  std::vector<multirail::RailDescription> described;
  for (const auto& r : rails_) {
    const auto& p = r->properties();
    described.push_back({p.name, p.latency_us_prior, p.gbps_prior, p.max_share_bytes});
  }
  rail_table_ = std::make_unique<multirail::RailTable>(std::move(described), cost_opt);
  failure_reported_.assign(rails_.size(), false);
  CacheRoundsOptions ro;
  ro.rank = config_.rank;
  ro.size = config_.size;
  ro.enabled = config_.cache_rounds;
  ro.fusion_threshold = config_.fusion_threshold;
  rounds_ = std::make_unique<CacheRounds>(ro);
  std::vector<std::string> rail_names;
  for (const auto& r : rails_) rail_names.push_back(r->properties().name);
  timeline_.open(config_.timeline_path, config_.rank, rail_names);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw NezhaError(std::string("eventfd failed: ") + std::strerror(errno));
}

Engine::~Engine() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    NZ_LOG(Error) << rank_prefix(config_.rank) << "shutdown failed: " << e.what();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::vector<std::string> Engine::listen_addresses() const {
  // [control path per rail..., data rail...]
  std::vector<std::string> out = control_->listen_addresses();
  for (const auto& r : rails_) out.push_back(r->local_address());
  return out;
}

void Engine::connect_and_start(const std::vector<std::vector<std::string>>& addrs_by_rank) {
  if (static_cast<int>(addrs_by_rank.size()) != config_.size)
    throw InvalidArgument("expected addresses of " + std::to_string(config_.size) + " ranks, got " +
                          std::to_string(addrs_by_rank.size()));
  auto column = [&](size_t i) {
    std::vector<std::string> col;
    for (int r = 0; r < config_.size; ++r) {
      if (addrs_by_rank[r].size() != 2 * rails_.size())
        throw InvalidArgument("rank " + std::to_string(r) + " has " +
                              std::to_string(addrs_by_rank[r].size() / 2) + " rails, rank " +
                              std::to_string(config_.rank) + " has " + std::to_string(rails_.size()));
      col.push_back(addrs_by_rank[r][i]);
    }
    return col;
  };
  Deadline deadline = Deadline::after_seconds(config_.connect_timeout_s);
  std::vector<std::vector<std::string>> control_columns;
  for (size_t i = 0; i < rails_.size(); ++i) control_columns.push_back(column(i));
  control_->connect_all(control_columns, deadline);
  for (size_t i = 0; i < rails_.size(); ++i) rails_[i]->connect(column(rails_.size() + i), deadline);
  refuse_partial_host_rails();
  addrs_by_rank_ = addrs_by_rank;
  const bool failover = failover_needed();

  ExecutorOptions eo;
  eo.rank = config_.rank;
  eo.size = config_.size;
  eo.timeout_s = config_.timeout_s;
  eo.segment_bytes = config_.segment_bytes;
  eo.logstep_max_bytes = config_.logstep_max_bytes;
  eo.failover = failover;
  eo.stall_s = config_.rail_stall_ms / 1000.0;
  ExecutorHooks hooks;
  if (failover) {
    hooks.on_rail_error = [this](int rail, const std::string& what, bool stalled, uint64_t seq) {
      // A stalled rail is not aborted here: rank 0 decides (a stall can be a late peer, or the echo
      // of another rail's failure on a slower rank), and kDown aborts it everywhere.
      report_rail_event({RailEventKind::kFailed, rail, -1, stalled ? seq + 1 : 0u, what});
    };
  }
  std::vector<transport::Rail*> rails;
  for (auto& r : rails_) rails.push_back(r.get());
  // Rail workers report each share's time to the rail table (the cost models) themselves; the
  // observer only feeds the timeline.
  executor_ = std::make_unique<Executor>(
      eo, rails, rail_table_.get(),
      [this](int rail, size_t bytes, Clock::time_point start, double s, const std::string& what) {
        timeline_.share_done(rail, what, start, s, bytes);
      },
      std::move(hooks));
  if (config_.rank == 0) {
    CoordinatorOptions co;
    co.size = config_.size;
    co.fusion_threshold = config_.fusion_threshold;
    co.cycle_time_s = config_.cycle_time_ms / 1000.0;
    co.stall_check_s = config_.stall_check_s;
    co.stall_shutdown_s = config_.stall_shutdown_s;
    coordinator_ = std::make_unique<Coordinator>(co);
    if (failover) {
      multirail::RailHealthOptions ho;
      ho.initial_backoff = std::chrono::milliseconds(static_cast<int64_t>(config_.rail_probe_backoff_s * 1000));
      ho.max_backoff = std::chrono::milliseconds(static_cast<int64_t>(config_.rail_probe_backoff_max_s * 1000));
      std::vector<std::string> names;
      for (const auto& r : rails_) names.push_back(r->properties().name);
      failover_ = std::make_unique<RailFailover>(config_.size, names, ho);
      completed_by_rank_.assign(config_.size, std::vector<uint64_t>(rails_.size(), 0));
    }
  }
  peer_shutdown_.assign(config_.size, false);
  calibrate_rails();
  last_heard_.assign(config_.size, Clock::now());
  path_switched_at_.assign(config_.size, Clock::time_point{});
  last_sent_ = Clock::now();
  thread_ = std::thread([this] { loop(); });
}

void Engine::refuse_partial_host_rails() const {
  for (const auto& rail : rails_) {
    const auto& props = rail->properties();
    if (props.reach != transport::RailReach::kHost) continue;
    std::string unreached;
    for (int peer = 0; peer < config_.size; ++peer)
      if (peer != config_.rank && !rail->reaches(peer)) unreached += (unreached.empty() ? "" : ", ") + std::to_string(peer);
    if (!unreached.empty())
      throw InvalidArgument(rank_prefix(config_.rank) + "rail '" + props.name + "' (kind " + props.kind +
                            ") reaches only the ranks of this host, not rank(s) " + unreached +
                            "; host-local rails are usable only when every rank shares one host "
                            "(hierarchical allreduce across hosts is not implemented yet): list only "
                            "network rails for this job");
  }
}

void Engine::wake() {
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means a wakeup is already pending
}

std::shared_ptr<OpHandle> Engine::enqueue(TensorEntry entry) {
  std::vector<TensorEntry> one;
  one.push_back(std::move(entry));
  return enqueue_all(std::move(one)).at(0);
}

std::vector<std::shared_ptr<OpHandle>> Engine::enqueue_all(std::vector<TensorEntry> entries) {
  if (!thread_.joinable()) throw InvalidArgument("nezha engine is not started; call nezha.init() first");
  // Every entry is checked before any is queued: a group must never be half in flight (its
  // members would wait for the missing ones on every rank).
  for (auto& entry : entries) {
    if (entry.req.type == OpType::kJoin) {
      entry.req.name = kJoinName;
    } else if (entry.req.name == kJoinName) {
      throw InvalidArgument(std::string("tensor name '") + kJoinName + "' is reserved for join()");
    } else if (entry.req.name.empty() || entry.req.name.size() > 4096) {
      throw InvalidArgument("tensor names must be 1 to 4096 characters long, got " +
                            std::to_string(entry.req.name.size()));
    }
    entry.req.check_scaling();
  }
  std::vector<std::shared_ptr<OpHandle>> handles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) throw NezhaError(failure_);
    if (shutdown_requested_) throw InvalidArgument("nezha has been shut down");
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string& name = entries[i].req.name;
      bool repeated = in_flight_.count(name) > 0;
      for (size_t j = 0; j < i && !repeated; ++j) repeated = entries[j].req.name == name;
      if (repeated)
        throw InvalidArgument("tensor name '" + name +
                              "' is already in flight; wait for it before reusing the name");
    }
    for (auto& entry : entries) {
      entry.handle = std::make_shared<OpHandle>();
      handles.push_back(entry.handle);
      std::string name = entry.req.name;
      in_flight_.emplace(name, std::move(entry));
      new_names_.push_back(name);
      timeline_.negotiation_started(name);
    }
  }
  wake();
  return handles;
}

void Engine::shutdown() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  wake();
  thread_.join();
  if (executor_) {
    executor_->stop();
    // A share lost as the rails closed is never redone now: fail it rather than leave it pending.
    executor_->fail_all("nezha shut down before it finished");
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, e] : in_flight_)
    if (e.handle) e.handle->complete("nezha shut down before tensor '" + name + "' was processed");
  in_flight_.clear();
  control_->close();
  for (auto& r : rails_) r->close();
  timeline_.close();
}

void Engine::fail_everything(const std::string& reason) {
  NZ_LOG(Error) << rank_prefix(config_.rank) << reason;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = reason;
  for (auto& [name, e] : in_flight_)
    if (e.handle) e.handle->complete("tensor '" + name + "': " + reason);
  in_flight_.clear();
  new_names_.clear();
  if (executor_) executor_->fail_all(reason);
  control_->abort(reason);
  for (auto& r : rails_) r->abort(reason);
}

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

std::vector<multirail::RailShare> Engine::plan_for(const Response& r) {
  if (r.kind != Response::Kind::kExecute) return {};
  multirail::OpToPlan op;
  for (int64_t c : r.counts) op.count += static_cast<size_t>(c);
  op.elem_size = dtype_size(r.dtype);
  op.splittable = r.type == OpType::kAllreduce;
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

void Engine::calibrate_rails() {
  // One rail needs no model. With several, each gets a few timed allreduces of a small and two
  // larger sizes (alpha from the first, beta from the others) before any user traffic, so the
  // very first large payload can already be striped (three samples per regime of the
  // SplitRegimeModel). Every rank runs the same sequence.
  if (rails_.size() < 2 || config_.size < 2) return;
  for (size_t rail = 0; rail < rails_.size(); ++rail)
    for (size_t bytes : multirail::RailTable::calibration_bytes())
      executor_->calibrate(static_cast<int>(rail), bytes);
  const std::vector<multirail::RailEstimate> estimates = rail_table_->estimates();
  for (size_t rail = 0; rail < rails_.size(); ++rail) {
    const auto& est = estimates[rail];
    NZ_LOG(Info) << rank_prefix(config_.rank) << "rail '" << rails_[rail]->properties().name
                 << "' calibrated: alpha " << est.alpha_us << " us, beta " << est.beta_gbps
                 << " Gbit/s";
  }
}

void Engine::dispatch(std::vector<Response> responses) {
  // A join response waits for a cache round in which every rank was joined (cache_rounds.h), and
  // what follows it waits behind it.
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

void Engine::execute_locally(const ResponseList& list, bool from_round) {
  if (!list.estimates.empty()) rail_table_->set_shared_estimates(list.estimates);
  for (const RailEvent& e : list.rail_events) apply_rail_event(e);
  if (!list.watermark.empty() && executor_) executor_->trim(list.watermark);
  for (const Response& resp : list.responses) {
    if (resp.type == OpType::kAllreduce) rail_table_->record_plan(resp.plan);
    std::vector<TensorEntry> entries;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool joined = in_flight_.count(kJoinName) > 0 && resp.type != OpType::kJoin;
      bool missing = false;
      for (size_t i = 0; i < resp.names.size(); ++i) {
        auto it = in_flight_.find(resp.names[i]);
        if (it == in_flight_.end()) {
          if (!(joined && resp.type == OpType::kAllreduce)) missing = true;
          entries.emplace_back();  // joined: contributes zeros, no handle
          continue;
        }
        if (i < resp.cache_ids.size() && resp.cache_ids[i] >= 0)
          rounds_->learn(resp.cache_ids[i], it->second.req, resp, i);
        rounds_->forget_pending(resp.names[i]);
        ++(from_round ? tensors_via_rounds_ : tensors_via_coordinator_);
        timeline_.negotiation_finished(resp.names[i]);
        entries.push_back(std::move(it->second));
        in_flight_.erase(it);
      }
      if (missing && resp.kind == Response::Kind::kExecute) {
        // Only possible if ranks disagree about what was negotiated: a bug or a corrupt peer.
        throw ProtocolError("coordinator scheduled tensor(s) this rank never submitted");
      }
    }
    if (resp.kind == Response::Kind::kError) {
      NZ_LOG(Warning) << rank_prefix(config_.rank) << resp.error;
    }
    if (resp.type == OpType::kJoin && resp.kind == Response::Kind::kExecute) rounds_->join_completed();
    if (!resp.inline_result.empty()) complete_inline(resp, entries);
    else executor_->execute(resp, std::move(entries));
  }
}

void Engine::complete_inline(const Response& resp, std::vector<TensorEntry>& entries) {
  deliver_inline_result(resp, entries, [this](const std::string& name, size_t bytes) {
    ++tensors_done_by_coordinator_;
    timeline_.done_by_coordinator(name, bytes);
  });
}

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

void Engine::loop() {
  std::optional<Clock::time_point> shutdown_deadline;
  try {
    while (!finished_) {
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
          break;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (shutdown_requested_ && !shutdown_deadline)
          shutdown_deadline = now + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(config_.timeout_s));
      }
      if (shutdown_deadline && now >= *shutdown_deadline) {
        NZ_LOG(Warning) << rank_prefix(config_.rank)
                        << "shutdown: not every rank shut down within " << config_.timeout_s
                        << " s; closing anyway";
        break;
      }
      // Sleep until a control message, new work, or the next timer.
      Clock::time_point until = now + seconds(std::min(kIdleWakeS, kHeartbeatS));
      if (coordinator_)
        if (auto t = coordinator_->next_wakeup(now)) until = std::min(until, *t);
      if (failover_)
        if (auto t = failover_->next_wakeup()) until = std::min(until, std::max(now, *t));
      if (auto t = rounds_->next_wakeup(config_.timeout_s, config_.stall_check_s))
        until = std::min(until, *t);
      if (shutdown_deadline) until = std::min(until, *shutdown_deadline);
      double wait_s = std::max(0.0, std::chrono::duration<double>(until - now).count());
      if (config_.size > 1) {
        try {
          auto msg = control_->recv_any(wake_fd_, Deadline::after_seconds(wait_s));
          if (msg) on_control_message(msg->peer, msg->payload);
        } catch (const PeerError& e) {
          if (!control_loss_expected(e.peer())) throw;
          NZ_LOG(Debug) << rank_prefix(config_.rank) << "control connection closed: " << e.what();
        }
      } else {
        pollfd pfd{wake_fd_, POLLIN, 0};
        ::poll(&pfd, 1, static_cast<int>(wait_s * 1000) + 1);
      }
      uint64_t drained;
      while (::read(wake_fd_, &drained, sizeof(drained)) > 0) {
      }
    }
  } catch (const PeerError& e) {
    std::string reason = "rank " + std::to_string(e.peer()) + " is unreachable: " + e.what();
    if (config_.rank == 0) broadcast_fatal(reason);
    fail_everything(reason);
  } catch (const std::exception& e) {
    std::string reason = std::string("engine stopped: ") + e.what();
    if (config_.rank == 0) broadcast_fatal(reason);
    fail_everything(reason);
  }
  finished_ = true;
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.tensors_via_rounds = tensors_via_rounds_;
  s.tensors_via_coordinator = tensors_via_coordinator_;
  s.tensors_done_by_coordinator = tensors_done_by_coordinator_;
  s.requests_to_coordinator = requests_to_coordinator_;
  s.rounds = rounds_completed_;
  return s;
}

std::vector<RailStat> Engine::rail_stats() const {
  std::vector<RailStat> out;
  const std::vector<multirail::RailStatus> status = rail_table_->status();
  for (size_t i = 0; i < rails_.size(); ++i) {
    RailStat s;
    const auto& props = rails_[i]->properties();
    s.name = props.name;
    s.local_addr = props.local_addr;
    s.protocol = props.kind;
    s.state = multirail::rail_state_name(status[i].state);
    auto c = rails_[i]->counters();
    s.bytes_sent = c.bytes_sent;
    s.bytes_received = c.bytes_received;
    // Every rank reports the coordinator's model (the one that decides the splits).
    s.alpha_us = status[i].estimate.alpha_us;
    s.beta_gbps = status[i].estimate.beta_gbps;
    s.share = status[i].share;
    out.push_back(s);
  }
  return out;
}

}  // namespace nezha::engine
