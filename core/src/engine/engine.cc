// Engine: construction, wiring the components (engine.h lists them), submitting, shutting down.
#include "engine/engine.h"
#include "transport/collective_rail.h"
#include "transport/host_lane.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/epoll_add.h"
#include "common/error.h"
#include "common/knobs.h"
#include "common/logging.h"
#include "common/usable_cores.h"
#include "engine/engine_internal.h"
#include "engine/failover/redo_scope.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {

using namespace internal;

EngineConfig EngineConfig::from_knobs() {
  EngineConfig c;
  c.fusion_threshold = static_cast<size_t>(std::max<int64_t>(0, knob_int("NEZHA_FUSION_THRESHOLD")));
  c.unfused_bytes = static_cast<size_t>(std::max<int64_t>(0, knob_int("NEZHA_UNFUSED_BYTES")));
  c.cycle_time_ms = knob_double("NEZHA_CYCLE_TIME_MS");
  c.timeout_s = knob_double("NEZHA_TIMEOUT_S");
  c.connect_timeout_s = knob_double("NEZHA_CONNECT_TIMEOUT_S");
  c.stall_check_s = knob_double("NEZHA_STALL_CHECK_S");
  c.stall_shutdown_s = knob_double("NEZHA_STALL_SHUTDOWN_S");
  c.logstep_max_bytes = static_cast<size_t>(knob_int("NEZHA_LOGSTEP_MAX_BYTES"));
  c.halving_max_bytes = static_cast<size_t>(knob_int("NEZHA_HALVING_MAX_BYTES"));
  c.segment_bytes = static_cast<size_t>(std::max<int64_t>(64, knob_int("NEZHA_SEGMENT_BYTES")));
  c.socket_buffer_bytes = static_cast<size_t>(knob_int("NEZHA_SOCKET_BUFFER_BYTES"));
  c.balance_bytes = static_cast<size_t>(std::max<int64_t>(0, knob_int("NEZHA_BALANCE_BYTES")));
  c.timeline_path = knob_string("NEZHA_TIMELINE");
  c.rail_stall_ms = knob_double("NEZHA_RAIL_STALL_MS");
  c.rail_failover = knob_int("NEZHA_RAIL_FAILOVER") != 0;
  c.cache_rounds = knob_int("NEZHA_CACHE_ROUNDS") != 0;
  c.host_vote = knob_int("NEZHA_HOST_VOTE") != 0;
  c.host_vote_spin_us = std::max(0.0, knob_double("NEZHA_HOST_VOTE_SPIN_US"));
  c.shm_control = knob_int("NEZHA_SHM_CONTROL") != 0;
  c.control_spin_us = std::max(0.0, knob_double("NEZHA_CONTROL_SPIN_US"));
  c.output_cache_bytes = static_cast<size_t>(std::max<int64_t>(0, knob_int("NEZHA_OUTPUT_CACHE_BYTES")));
  // Capped so the largest result fits one control-message string.
  c.hierarchical = knob_int("NEZHA_HIERARCHICAL") != 0;
  c.host_lane = knob_string("NEZHA_HOST_LANE");
  if (c.host_lane != "shm" && c.host_lane != "shmcoll")
    throw InvalidArgument("NEZHA_HOST_LANE must be shm or shmcoll, not '" + c.host_lane + "'");
  c.control_inline_bytes = static_cast<size_t>(
      std::clamp<int64_t>(knob_int("NEZHA_CONTROL_INLINE_BYTES"), 0, kMaxControlString));
  return c;
}

Engine::Engine(EngineConfig config) : config_(std::move(config)) {
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size)
    throw InvalidArgument("rank " + std::to_string(config_.rank) + " is out of range for size " +
                          std::to_string(config_.size));
  if (config_.rails.empty()) config_.rails.push_back({"lo", "127.0.0.1", "tcp", {}});
  output_pool_.start(config_.output_cache_bytes);
  process_sets_ = std::make_unique<ProcessSetTable>(config_.size);
  build_rails();  // may fold a host-local rail into the network rails (config_.rails follows)
  // The control channel has its own connections on every rail's IPv4 address (or the control address
  // for a rail without one, such as shm): negotiation never queues behind bulk data, and losing a rail
  // (rail 0 included) does not cut it.
  std::vector<ControlPathConfig> paths;
  for (const auto& rail : rails_) {
    const transport::RailProperties& p = rail->properties();
    paths.push_back({p.name, p.bind_ip.empty() ? config_.control_addr : p.bind_ip, "tcp", ""});
  }
  // Ranks sharing a host also get a shared-memory path among them, which the channel prefers: no
  // network stack and no wake-up while the peer is busy (shm_message_path.h). After the rails'
  // paths, so that path i stays rail i's (failover avoids paths by rail).
  // Decided alike on every rank (the address columns must agree): some host holds several ranks.
  if (config_.shm_control && config_.cross_size < config_.size) {
    paths.push_back({"shm", "", "shm", config_.host_id});
    // Spinning pays only where every local rank has a core: with more ranks than cores, a rank that
    // spins takes the CPU the rank it waits for needs.
    control_spins_ = config_.control_spin_us > 0 && config_.local_size > 1 && config_.local_size <= usable_cores();
  }
  // A one-host job's shared-memory path carries the host board in rank 0's segment (host_vote.h):
  // sized alike on every rank, from what every rank knows.
  const bool one_host = config_.size > 1 && config_.cross_size == 1 && config_.local_size == config_.size;
  const size_t board_bytes = one_host ? HostVoteBoard::bytes_for(config_.size) : 0;
  control_ = std::make_unique<ControlChannel>(paths, config_.secret, config_.rank, config_.size,
                                              config_.socket_buffer_bytes, board_bytes);
  // Two consecutive samples off the model in the same direction count as a real change of
  // speed (a re-shaped or congested link): shares then follow within two large operations.
  multirail::RailCostModelOptions cost_opt;
  cost_opt.shift_run = 2;
  cost_opt.min_samples = 2;
  cost_opt.jump_ratio = 2.0;  // large payloads only reach this model (SplitRegimeModel)
  std::vector<multirail::RailDescription> described;
  for (const auto& r : rails_) {
    const auto& p = r->properties();
    multirail::RailDescription d;
    d.name = p.name;
    d.latency_us_prior = p.latency_us_prior;
    transport::CollectiveRail* coll = r->as_collective();
    d.gbps_prior = multirail::share_gbps_prior(p.gbps_prior, coll != nullptr, config_.size);
    d.max_share_bytes = p.max_share_bytes;
    d.point_to_point = r->as_point_to_point() != nullptr;
    d.host_memory = p.host_memory;
    if (coll) d.reduces = [coll](DataType t, ReduceOp o) { return coll->reduces(t, o); };
    if (coll) d.runs = [coll](multirail::RailOp o) { return coll->runs(to_collective_op(o)); };
    described.push_back(std::move(d));
  }
  rail_table_ = std::make_unique<multirail::RailTable>(std::move(described), cost_opt);
  std::vector<std::string> rail_names;
  for (const auto& r : rails_) rail_names.push_back(r->properties().name);
  timeline_.open(config_.timeline_path, config_.rank, rail_names);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw NezhaError(std::string("eventfd failed: ") + std::strerror(errno));
  loop_epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (loop_epoll_ < 0 || epoll_add_readable(loop_epoll_, wake_fd_) != 0)
    throw NezhaError(std::string("the engine loop's epoll set: ") + std::strerror(errno));
  lead_epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (lead_epoll_ < 0 || epoll_add_readable(lead_epoll_, wake_fd_) != 0)
    throw NezhaError(std::string("the leading caller's epoll set: ") + std::strerror(errno));
}

Engine::~Engine() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    NZ_LOG(Error) << rank_prefix(config_.rank) << "shutdown failed: " << e.what();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (loop_epoll_ >= 0) ::close(loop_epoll_);
  if (lead_epoll_ >= 0) ::close(lead_epoll_);
}

std::vector<std::string> Engine::listen_addresses() const {
  // [control path per rail..., the host path (if any), data rail...]
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
      if (addrs_by_rank[r].size() != control_->path_count() + rails_.size())
        throw InvalidArgument("rank " + std::to_string(r) + " has " + std::to_string(addrs_by_rank[r].size()) +
                              " addresses (control paths and rails), rank " + std::to_string(config_.rank) +
                              " has " + std::to_string(control_->path_count() + rails_.size()));
      col.push_back(addrs_by_rank[r][i]);
    }
    return col;
  };
  Deadline deadline = Deadline::after_seconds(config_.connect_timeout_s);
  std::vector<std::vector<std::string>> control_columns;
  for (size_t i = 0; i < control_->path_count(); ++i) control_columns.push_back(column(i));
  // Negotiation is a star through rank 0 unless cache rounds run among the workers: a worker then
  // connects to rank 0 only (n - 1 connections per path instead of n(n - 1) / 2).
  if (!config_.cache_rounds && config_.rank != 0)
    for (auto& col : control_columns)
      for (int r = 1; r < config_.size; ++r)
        if (r != config_.rank) col[static_cast<size_t>(r)].clear();
  control_->connect_all(control_columns, deadline);
  set_up_host_vote();
  for (size_t i = 0; i < rails_.size(); ++i) rails_[i]->connect(column(control_->path_count() + i), deadline);
  refuse_partial_host_rails();
  wire_components(addrs_by_rank);
  calibrate_rails();
  // After calibration: the negotiator's liveness clocks start with the loop.
  make_negotiator();
  if (config_.size > 1 && (epoll_add_readable(loop_epoll_, control_->watch_fd()) != 0 ||
                           epoll_add_readable(lead_epoll_, control_->watch_fd()) != 0))
    throw NezhaError(std::string("the engine loop's epoll set: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

bool Engine::failover_needed() const {
  if (!config_.rail_failover || config_.size < 2) return false;
  std::vector<RedoRail> rails;
  for (const auto& r : rails_) rails.push_back({r->properties().can_fail_alone, r->as_point_to_point() != nullptr});
  return failover_can_help(rails);
}

void Engine::wire_components(const std::vector<std::vector<std::string>>& addrs_by_rank) {
  const bool failover = failover_needed();
  std::vector<transport::Rail*> rails;
  for (auto& r : rails_) rails.push_back(r.get());

  // The failover controller reaches the executor and the negotiator only through these closures.
  // executor_ is set below and negotiator_ in make_negotiator(), both before the loop starts; until
  // then nothing calls them (rail workers only queue reports, which the loop takes).
  RailWork work;
  work.completed = [this] { return executor_->completed(); };
  work.running = [this](int rail) { return executor_->running(rail); };
  work.post_task = [this](int rail, std::function<void()> task) { executor_->post_task(rail, std::move(task)); };
  work.post_probe = [this](int rail, size_t bytes, std::function<void()> prepare,
                           std::function<void(const std::string&)> done) {
    executor_->post_probe(rail, bytes, std::move(prepare), std::move(done));
  };
  work.redo = [this](int rail, uint64_t first, int target) { executor_->redo(rail, first, target); };
  FailoverLinks flinks;
  flinks.avoid_path = [this](int rail, bool avoid) { control_->avoid_path(rail, avoid); };
  flinks.send_to_coordinator = [this](std::vector<RailEvent> e) { negotiator_->send_rail_events(std::move(e)); };
  flinks.broadcast_in_order = [this](std::vector<RailEvent> e) { negotiator_->broadcast_in_order(std::move(e)); };
  flinks.wake = [this] { wake(); };
  FailoverOptions fo;
  fo.rank = config_.rank;
  fo.size = config_.size;
  fo.enabled = failover;
  fo.health.initial_backoff = std::chrono::milliseconds(static_cast<int64_t>(config_.rail_probe_backoff_s * 1000));
  fo.health.max_backoff = std::chrono::milliseconds(static_cast<int64_t>(config_.rail_probe_backoff_max_s * 1000));
  for (const auto& r : rails_) fo.redo_targets.push_back(r->as_point_to_point() != nullptr);
  for (const auto& addrs : addrs_by_rank)  // [control paths..., data rails...]: the data rails'
    fo.rail_addrs_by_rank.emplace_back(addrs.begin() + static_cast<std::ptrdiff_t>(control_->path_count()), addrs.end());
  failover_ = std::make_unique<FailoverController>(std::move(fo), rails, *rail_table_, std::move(work),
                                                   std::move(flinks));

  ExecutorOptions eo;
  eo.rank = config_.rank;
  eo.size = config_.size;
  eo.timeout_s = config_.timeout_s;
  eo.segment_bytes = config_.segment_bytes;
  eo.logstep_max_bytes = config_.logstep_max_bytes;
  eo.halving_max_bytes = config_.halving_max_bytes;
  eo.balance_bytes = config_.balance_bytes;
  eo.failover = failover;
  eo.stall_s = config_.rail_stall_ms / 1000.0;
  eo.process_sets = process_sets_.get();
  ExecutorHooks hooks;
  if (failover) {
    hooks.on_rail_error = [this](int rail, const std::string& what, bool stalled, uint64_t seq) {
      // A stalled rail is not aborted here: rank 0 decides (a stall can be a late peer, or the echo
      // of another rail's failure on a slower rank), and kDown aborts it everywhere.
      failover_->report({RailEventKind::kFailed, rail, -1, stalled ? seq + 1 : 0u, what});
    };
  }
  // Rail workers report each share's time to the rail table (the cost models) themselves; the
  // observer only feeds the timeline.
  executor_ = std::make_unique<Executor>(
      eo, rails, rail_table_.get(),
      [this](int rail, size_t bytes, Clock::time_point start, double s, double rail_s, const std::string& what) {
        timeline_.share_done(rail, what, start, s, rail_s, bytes);
      },
      std::move(hooks));
}

void Engine::make_negotiator() {
  NegotiatorOptions no;
  no.rank = config_.rank;
  no.size = config_.size;
  no.timeout_s = config_.timeout_s;
  no.stall_check_s = config_.stall_check_s;
  no.control_inline_bytes = config_.control_inline_bytes;
  for (const auto& r : rails_) no.rail_names.push_back(r->properties().name);
  no.coordinator.size = config_.size;
  no.coordinator.fusion_threshold = config_.fusion_threshold;
  no.coordinator.unfused_bytes = config_.unfused_bytes;
  no.coordinator.cycle_time_s = config_.cycle_time_ms / 1000.0;
  no.coordinator.stall_check_s = config_.stall_check_s;
  no.coordinator.stall_shutdown_s = config_.stall_shutdown_s;
  no.coordinator.process_sets = process_sets_.get();
  no.rounds.rank = config_.rank;
  no.rounds.size = config_.size;
  no.rounds.enabled = config_.cache_rounds;
  no.rounds.fusion_threshold = config_.fusion_threshold;
  no.rounds.unfused_bytes = config_.unfused_bytes;
  NegotiatorLinks nlinks;
  nlinks.execute = [this](const Response& r, std::vector<TensorEntry> e) { executor_->execute(r, std::move(e)); };
  nlinks.skip = [this](const Response& r) { executor_->skip(r); };
  nlinks.trim = [this](const std::vector<uint64_t>& w) { executor_->trim(w); };
  nlinks.completed = [this] { return failover_->completed_if_enabled(); };
  nlinks.watermark = [this] { return failover_->watermark(); };
  nlinks.completed_from = [this](int rank, const std::vector<uint64_t>& c) { failover_->on_completed_from(rank, c); };
  nlinks.rail_events_from = [this](int rank, const std::vector<RailEvent>& e) { failover_->on_events_from(rank, e); };
  nlinks.apply_rail_event = [this](const RailEvent& e) { failover_->apply(e); };
  nlinks.fail = [this](const std::string& reason) { fail_everything(reason); };
  if (host_vote_)
    nlinks.learned = [this](const Request& own, const Response& resp, size_t index) { host_vote_->learn(own, resp, index); };
  negotiator_ = std::make_unique<Negotiator>(std::move(no), *control_, *rail_table_, submissions_, *process_sets_,
                                             timeline_, std::move(nlinks));
}

void Engine::refuse_partial_host_rails() const {
  for (const auto& r : rails_) {
    const auto& props = r->properties();
    transport::PointToPointRail* rail = r->as_point_to_point();  // a collective rail reaches no peer
    if (!rail || props.reach != transport::RailReach::kHost) continue;
    std::string unreached;
    for (int peer = 0; peer < config_.size; ++peer)
      if (peer != config_.rank && !rail->reaches(peer)) unreached += (unreached.empty() ? "" : ", ") + std::to_string(peer);
    if (!unreached.empty())
      throw InvalidArgument(rank_prefix(config_.rank) + "rail '" + props.name + "' (kind " + props.kind +
                            ") reaches only the ranks of this host, not rank(s) " + unreached +
                            "; alone it serves only a job on one host: list network rails beside it "
                            "(with NEZHA_HIERARCHICAL=1 it becomes their host lane) or only network rails");
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

std::vector<std::shared_ptr<OpHandle>> Engine::enqueue_all(std::vector<TensorEntry> entries, double lead_s,
                                                           bool waits_to_end) {
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
    if (entry.req.process_set != 0) {
      const int32_t id = entry.req.process_set;
      auto members = process_sets_->members(id);
      const std::string what = std::string(op_type_name(entry.req.type)) + " of tensor '" + entry.req.name + "'";
      if (!members) throw InvalidArgument(what + ": process set " + std::to_string(id) + " is not registered");
      if (entry.req.type == OpType::kJoin) throw InvalidArgument("join() is for every rank; it takes no process set");
      if (!std::binary_search(members->begin(), members->end(), config_.rank))
        throw InvalidArgument(what + ": rank " + std::to_string(config_.rank) + " is not in process set " +
                              std::to_string(id) + " (" + members_str(*members) + ")");
      entry.req.name = process_set_name(entry.req.name, id);
    }
    entry.req.check_scaling();
  }
  // Host votes (host_vote.h): which entries vote or count themselves out on the board; a join
  // breaks it for good before it is queued (a joined rank submits nothing a vote could wait for).
  std::vector<HostVote::Step> steps;
  if (host_vote_) {
    if (std::any_of(entries.begin(), entries.end(), [](const TensorEntry& e) { return e.req.type == OpType::kJoin; }))
      host_vote_->board().break_all();
    steps = host_vote_->plan(entries, lead_s > 0 && waits_to_end);
  }
  const bool votes = steps.size() == 1 && steps[0].kind == HostVote::Step::Kind::kVote;
  const void* vote_input = votes ? entries[0].input : nullptr;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<OpHandle>> handles =
      submissions_.add(std::move(entries), [&](const std::string& name) {
        if (lead_s > 0 || votes) names.push_back(name);
        timeline_.negotiation_started(name);
      }, /*queue=*/!votes);
  if (host_vote_) {
    host_vote_->commit(steps);
    for (const HostVote::Step& step : steps)
      if (step.kind == HostVote::Step::Kind::kDivert) {
        host_vote_->board().arrive(step.slot, step.seq, nullptr, 0, /*divert=*/true);
        ++host_votes_diverted_;
      }
  }
  if (votes && run_host_vote(steps[0], handles[0], names[0], vote_input)) return handles;
  if (lead_s > 0 && config_.size > 1)
    lead(handles, names, lead_s, waits_to_end);
  else
    wake();
  return handles;
}

int32_t Engine::add_process_set(std::vector<int> ranks) { return process_sets_->add(std::move(ranks)); }

bool Engine::remove_process_set(int32_t id) {
  return submissions_.remove_set_if_idle(id, [&] { return process_sets_->remove(id); });
}

std::vector<int> Engine::process_set_ranks(int32_t id) const {
  auto members = process_sets_->members(id);
  if (!members) throw InvalidArgument("process set " + std::to_string(id) + " is not registered");
  return *members;
}

void Engine::shutdown() {
  if (!thread_.joinable()) return;
  // A rank that stops votes no more: whoever waits on it goes to rank 0, which knows it stopped.
  if (host_vote_) host_vote_->board().break_all();
  submissions_.request_shutdown();
  wake();
  thread_.join();
  if (executor_) {
    executor_->stop();
    // A share lost as the rails closed is never redone now: fail it rather than leave it pending.
    executor_->fail_all("nezha shut down before it finished");
  }
  submissions_.close();
  control_->close();
  for (auto& r : rails_) r->close();
  timeline_.close();
}

void Engine::fail_everything(const std::string& reason) {
  NZ_LOG(Error) << rank_prefix(config_.rank) << reason;
  if (host_vote_) host_vote_->board().break_all();
  submissions_.fail_all(reason);
  if (executor_) executor_->fail_all(reason);
  control_->abort(reason);
  for (auto& r : rails_) r->abort(reason);
}

EngineStats Engine::stats() const {
  EngineStats s;
  if (negotiator_) {  // set once, in connect_and_start()
    const NegotiatorStats n = negotiator_->stats();
    s.tensors_via_rounds = n.tensors_via_rounds;
    s.tensors_via_coordinator = n.tensors_via_coordinator;
    s.tensors_done_by_coordinator = n.tensors_done_by_coordinator;
    s.operations_on_rails = n.operations_on_rails;
    s.requests_to_coordinator = n.requests_to_coordinator;
    s.rounds = n.rounds;
  }
  s.tensors_by_host_vote = tensors_by_host_vote_.load();
  s.host_votes_diverted = host_votes_diverted_.load();
  s.callers_led = leads_;
  s.control_messages_shared_memory = control_->sent_on_reliable_paths();
  s.control_messages_network = control_->sent_on_other_paths();
  if (executor_) {  // set once, in connect_and_start()
    s.bytes_staged = executor_->bytes_staged();
    s.bytes_kept_for_redo = executor_->bytes_kept_for_redo();
    s.shares_run_by_callers = executor_->shares_run_by_callers();
  }
  const OutputPool::Stats pool = OutputPool::get().stats();
  s.output_blocks_reused = pool.reused;
  s.output_blocks_allocated = pool.allocated;
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
    s.kind = props.kind;
    s.state = multirail::rail_state_name(status[i].state);
    auto c = rails_[i]->counters();
    s.bytes_sent = c.bytes_sent;
    s.bytes_received = c.bytes_received;
    if (transport::PointToPointRail* p2p = rails_[i]->as_point_to_point())
      if (transport::HostLane* lane = p2p->host_lane()) s.lane_bytes_sent = lane->lane().counters().bytes_sent;
    // Every rank reports the coordinator's model (the one that decides the splits).
    s.alpha_us = status[i].estimate.alpha_us;
    s.beta_gbps = status[i].estimate.beta_gbps;
    s.bulk_alpha_us = status[i].estimate.bulk_alpha_us;
    s.mid_alpha_us = status[i].estimate.mid_alpha_us;
    s.mid_beta_gbps = status[i].estimate.mid_beta_gbps;
    s.min_striped_bytes = status[i].estimate.min_striped_bytes;
    s.share = status[i].share;
    out.push_back(s);
  }
  return out;
}

}  // namespace nezha::engine
