#include "engine/execution/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <utility>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/host_lane.h"

namespace nezha::engine {
namespace {
constexpr double kHierarchyStallS = 0.5;  // see the constructor
}  // namespace

Executor::Executor(ExecutorOptions opt, std::vector<transport::Rail*> rails, multirail::RailTable* table,
                   ShareObserver observer, ExecutorHooks hooks)
    : opt_(opt),
      ctx_(std::make_unique<TaskContext>(opt, std::move(rails), table, std::move(observer), std::move(hooks))),
      seq_(ctx_->rails.size(), 0) {
  for (size_t i = 0; i < ctx_->rails.size(); ++i) workers_.push_back(std::make_unique<RailWorker>());
  if (!ctx_->watchdog) return;
  for (size_t r = 0; r < ctx_->rails.size(); ++r) {
    const transport::HostLane* lane = ctx_->host_lane(static_cast<int>(r));
    // Across hosts a rank's network rail is silent while the other host's ranks still
    // reduce-scatter over shared memory, and (uneven placements) while the host with fewer ranks
    // serves the other slices' groups (collectives/hierarchy.h): on a loaded host such silences
    // outlast the default limit, which would take them for a cut cable. Such rails get a higher
    // floor; a cut is still found.
    if (lane && lane->placement().hosts() > 1)
      ctx_->watchdog->set_min_silence(static_cast<int>(r), kHierarchyStallS);
  }
}

Executor::~Executor() { stop(); }

uint64_t Executor::bytes_kept_for_redo() const { return ctx_->kept_bytes; }

void Executor::stop() {
  for (auto& w : workers_) w->stop();
  if (ctx_->watchdog) ctx_->watchdog->stop();
}

void Executor::execute(const Response& resp, std::vector<TensorEntry> entries) {
  if (resp.kind == Response::Kind::kError) {
    for (auto& e : entries)
      if (e.handle) e.handle->complete(resp.error);
    return;
  }
  if (resp.process_set != 0 && !(opt_.process_sets && opt_.process_sets->members(resp.process_set))) {
    const std::string why = std::string(op_type_name(resp.type)) + " of " + names_str(resp) + ": process set " +
                            std::to_string(resp.process_set) + " is not registered on rank " + std::to_string(opt_.rank);
    for (auto& e : entries)
      if (e.handle) e.handle->complete(why);
    return;
  }
  switch (resp.type) {
    case OpType::kAllreduce:
      run_allreduce(resp, std::move(entries));
      return;
    case OpType::kBarrier:
      for (auto& e : entries) e.handle->complete();
      return;
    case OpType::kJoin:
      for (auto& e : entries) {
        e.handle->result().last_joined_rank = resp.last_joined_rank;
        e.handle->complete();
      }
      return;
    default:
      if (resp.names.size() > 1) run_fused(resp, std::move(entries));
      else run_on_one_rail(resp, std::move(entries));
  }
}

std::shared_ptr<const std::vector<int>> Executor::members_of(const Response& resp) const {
  if (resp.process_set == 0) return nullptr;
  auto members = opt_.process_sets ? opt_.process_sets->members(resp.process_set) : nullptr;
  if (!members)
    throw NezhaError("process set " + std::to_string(resp.process_set) + " is not registered on rank " +
                     std::to_string(opt_.rank));
  return members;
}

void Executor::skip(const Response& resp) {
  // Every rail the members run a share on: allreduce and the striped collectives take one operation
  // number per share of the plan (run_allreduce, run_striped), a one-rail collective its rail's.
  std::vector<int> rails;
  if (resp.type != OpType::kBarrier && resp.type != OpType::kJoin) {
    for (const auto& share : resp.plan) rails.push_back(share.rail);
    if (rails.empty()) rails.push_back(0);
  }
  for (int rail : rails) post(std::make_shared<SkippedOp>(rail));
}

size_t largest_share(const std::vector<multirail::RailShare>& plan) {
  size_t best = 0;
  for (size_t i = 1; i < plan.size(); ++i)
    if (plan[i].count > plan[best].count) best = i;
  return best;
}

void Executor::post(std::shared_ptr<ShareTask> task, bool may_inline, bool for_caller) {
  const int r = task->rail();
  task->seq = seq_[r]++;
  if (opt_.failover) ctx_->ledger.enter(task);
  post_entered(std::move(task), may_inline, for_caller);
}

void Executor::post_entered(std::shared_ptr<ShareTask> task, bool may_inline, bool for_caller) {
  const int r = task->rail();
  auto run = [this, task] { task->run(*ctx_); };
  if (may_inline && workers_[r]->try_run_inline(run)) return;
  if (for_caller && caller_leads_) {
    workers_[r]->post_unannounced(std::move(run));
    if (std::find(held_rails_.begin(), held_rails_.end(), r) == held_rails_.end()) held_rails_.push_back(r);
    return;
  }
  workers_[r]->post(std::move(run));
}

void Executor::begin_caller_lead() { caller_leads_ = true; }

std::vector<int> Executor::end_caller_lead() {
  caller_leads_ = false;
  return std::exchange(held_rails_, {});
}

void Executor::run_held_here(const std::vector<int>& rails, const std::function<bool()>& done) {
  if (rails.empty()) return;
  // One thread runs one rail's tasks: the others' workers take theirs meanwhile.
  for (size_t i = 1; i < rails.size(); ++i) workers_[rails[i]]->announce();
  RailWorker& here = *workers_[rails[0]];
  while (!done() && here.run_front_here()) ++shares_run_by_callers_;
  here.announce();
}

void Executor::timed_test_allreduce(int rail, size_t bytes, uint64_t seq, double timeout_s,
                                    const char* label, bool observe) {
  const size_t count = bytes / sizeof(float);
  BufferPool::Buffer buf = ctx_->pool.acquire(count * sizeof(float));
  std::memset(buf.data(), 0, count * sizeof(float));
  collectives::CollectiveOptions copt = ctx_->collective_options(seq, timeout_s);
  auto start = std::chrono::steady_clock::now();
  ctx_->allreduce_on(rail, buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, copt);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ctx_->completed[rail] = seq + 1;
  if (ctx_->table && observe) ctx_->table->observe(rail, count * sizeof(float), secs);
  // Calibration runs before user traffic, on idle cores: its wall time is learned as it is (the
  // rail's own time of a fast rail's small payloads is too little for a peer's wait to be told
  // from the timing noise, and correcting some of its few samples and not others misleads the fit).
  if (ctx_->observer) ctx_->observer(rail, count * sizeof(float), start, secs, secs, label);
}

void Executor::calibrate(int rail_index, size_t bytes, bool observe) {
  const uint64_t seq = seq_[rail_index]++;
  std::promise<void> done;
  auto result = done.get_future();
  workers_[rail_index]->post([&, rail_index, bytes, seq, observe] {
    try {
      timed_test_allreduce(rail_index, bytes, seq, opt_.timeout_s, observe ? "calibration" : "calibration warm-up",
                           observe);
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  result.get();
}

void Executor::run_allreduce(const Response& resp, std::vector<TensorEntry> entries) {
  auto job = std::make_shared<AllreduceJob>();
  job->resp = resp;
  job->entries = std::move(entries);
  job->posted = Clock::now();
  job->members = members_of(resp);
  job->size = job->members ? static_cast<int>(job->members->size()) : opt_.size;
  const size_t esize = dtype_size(resp.dtype);
  size_t total = 0;
  for (int64_t c : resp.counts) total += static_cast<size_t>(c);

  TensorEntry* lone = job->entries.size() == 1 && job->entries[0].handle ? &job->entries[0] : nullptr;
  if (lone && lone->output) {
    // A lone tensor is reduced in the caller's output, reading its input where it is (an
    // out-of-place allreduce). Copying the input into the output here first held every rank's rails
    // idle for the copy and a fresh output's first-touch page faults: a jitted 64 MB allreduce into
    // XLA's output waited 30-100 ms per call for it, 1.44 Gbit/s against 1.86 reduced in place, on
    // two 1 Gbit/s rails. Only a prescaled tensor is copied first, to be scaled there.
    job->data = static_cast<uint8_t*>(lone->output);
    job->input = static_cast<const uint8_t*>(lone->input);
    if (resp.prescale != 1.0 && job->input != job->data) {
      std::memcpy(job->data, job->input, total * esize);
      staged_bytes_ += total * esize;
      job->input = job->data;
    }
  } else {
    job->fusion = ctx_->pool.acquire(total * esize);
    job->data = job->fusion.data();
    job->input = job->data;
    size_t off = 0;
    for (size_t i = 0; i < job->entries.size(); ++i) {
      size_t bytes = static_cast<size_t>(resp.counts[i]) * esize;
      if (job->entries[i].handle) std::memcpy(job->data + off, job->entries[i].input, bytes);
      else std::memset(job->data + off, 0, bytes);  // joined rank: contributes zeros
      off += bytes;
    }
    staged_bytes_ += total * esize;
  }
  if (resp.prescale != 1.0) collectives::scale(job->data, total, resp.dtype, resp.prescale);

  std::vector<multirail::RailShare> plan = resp.plan;
  if (plan.empty()) plan.push_back({0, 0, total});
  if (balances(plan, total * esize, job->size, opt_.balance_bytes)) {
    // Ranges start on 4 KiB from their share's start (whole pages for the copies and the ring).
    const size_t align = std::max<size_t>(1, 4096 / esize);
    const size_t min_claim = leader_min_range_bytes(plan, opt_.balance_bytes) / esize;
    const size_t tail_claim = leader_min_range_bytes(plan, opt_.balance_bytes / kTailClaimSpread) / esize;
    job->balancer = std::make_unique<ShareBalancer>(plan, min_claim, align, min_claim / kMinClaimSpread, tail_claim);
    if (opt_.failover) job->original = ctx_->originals.acquire(total * esize);
  }
  job->parts_left = static_cast<int>(plan.size());
  if (ctx_->table && !job->members) {  // a process set's time is not the job's (StripingCheck)
    job->timed_by = ctx_->table;
    job->striped = plan.size() > 1;
  }
  const size_t callers = largest_share(plan);
  for (size_t part = 0; part < plan.size(); ++part) {
    const multirail::RailShare& share = plan[part];
    std::shared_ptr<ShareTask> task;
    if (job->balancer) task = std::make_shared<BalancedRange>(job, share.rail, part);
    else task = std::make_shared<AllreduceShare>(job, share);
    // Small lone payloads run on the engine thread when the rail is idle: a thread handoff costs
    // more than the whole log-step exchange.
    // With failover the engine thread must never wait on a rail: it is what reacts to the rail's
    // failure (and a rank blocked there would stall every other rail's redo).
    post(std::move(task), !opt_.failover && plan.size() == 1 && share.count * esize <= opt_.inline_max_bytes,
         part == callers);
  }
}

size_t Executor::leader_min_range_bytes(const std::vector<multirail::RailShare>& plan, size_t agreed_min) const {
  if (!ctx_->table) return agreed_min;
  return engine::leader_min_range_bytes(plan, ctx_->table->estimates(), agreed_min);
}

bool Executor::balances(const std::vector<multirail::RailShare>& plan, size_t bytes, int size,
                        size_t min_range_bytes) const {
  if (opt_.balance_bytes == 0 || plan.size() < 2 || size < 2 || bytes < kBalanceMinRanges * min_range_bytes)
    return false;
  for (const auto& share : plan) {
    // A collective rail reduces its share itself and carries no claims: the plan's split (its own
    // cost model) stands.
    if (!ctx_->rails[share.rail]->as_point_to_point()) return false;
  }
  return true;
}

}  // namespace nezha::engine
