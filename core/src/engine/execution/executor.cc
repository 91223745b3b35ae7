#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {
constexpr double kHierarchyStallS = 0.5;  // see use_hierarchical()
}  // namespace

Executor::Executor(ExecutorOptions opt, std::vector<transport::Rail*> rails,
                   multirail::RailTable* table, ShareObserver observer, ExecutorHooks hooks)
    : opt_(opt),
      rails_(std::move(rails)),
      table_(table),
      observer_(std::move(observer)),
      hooks_(std::move(hooks)),
      seq_(rails_.size(), 0),
      completed_(new std::atomic<uint64_t>[rails_.size()]),
      running_(new std::atomic<uint64_t>[rails_.size()]),
      lost_(new std::atomic<bool>[rails_.size()]),
      ledger_(rails_.size()) {
  for (size_t i = 0; i < rails_.size(); ++i) {
    completed_[i] = running_[i] = 0;
    lost_[i] = false;
  }
  if (opt_.failover && hooks_.on_rail_error)
    watchdog_ = std::make_unique<RailWatchdog>(
        rails_.size(), opt_.stall_s, [this](int rail) {
          auto c = rails_[rail]->counters();
          return c.bytes_sent + c.bytes_received;
        },
        [this](int rail, const std::string& what) {
          hooks_.on_rail_error(rail, what, /*stalled=*/true, running_[rail] - 1);
        },
        [this](int rail) { return rails_[rail]->link_fault(); },
        [this](int rail, const std::string& what) {
          // A certain failure: no check whether peers are merely late. On the last rail up it is
          // left to the silence limit and the operation's deadline, as a stall is (a cable
          // plugged back within NEZHA_TIMEOUT_S then costs a pause, not the job).
          int up = 0;
          for (size_t i = 0; i < rails_.size(); ++i)
            up += table_ && table_->state(static_cast<int>(i)) == multirail::RailState::kUp;
          const bool certain = !table_ || up >= 2;
          hooks_.on_rail_error(rail, what, /*stalled=*/!certain, running_[rail] - 1);
        },
        [this](int rail, std::chrono::milliseconds quiet) { return rails_[rail]->delivering(quiet); });
  for (size_t i = 0; i < rails_.size(); ++i) workers_.push_back(std::make_unique<RailWorker>());
}

Executor::~Executor() { stop(); }

void Executor::stop() {
  for (auto& w : workers_) w->stop();
  if (watchdog_) watchdog_->stop();
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
  for (int rail : rails) {
    auto rec = std::make_shared<ShareRecord>();
    rec->skipped = true;
    rec->share = {rail, 0, 0};
    rec->seq = seq_[rail]++;
    if (opt_.failover) {
      std::lock_guard<std::mutex> lock(ledger_mu_);
      ledger_[rail].push_back(rec);
    }
    post_share(std::move(rec), false);
  }
}

void Executor::run_skipped(ShareRecord& rec) {
  if (lost_[rec.share.rail]) {
    // Behind a share lost on this rail: lost as well (it moves with the redo), never done, or
    // completed() would pass the lost share and the redo agreed from it would leave it out (a set's
    // allreduce cut there never finished: ProcessSetEngineFailover).
    std::lock_guard<std::mutex> lock(ledger_mu_);
    rec.state = ShareRecord::State::kLost;
    return;
  }
  record_started(rec, nullptr, 0);
  record_done(rec);
}

collectives::CollectiveOptions Executor::options(uint64_t seq, double timeout_s) const {
  collectives::CollectiveOptions copt;
  copt.seq = seq;
  copt.segment_bytes = opt_.segment_bytes;
  copt.logstep_max_bytes = opt_.logstep_max_bytes;
  copt.deadline = Deadline::after_seconds(timeout_s);
  return copt;
}

void Executor::timed_test_allreduce(int rail, size_t bytes, uint64_t seq, double timeout_s,
                                    const char* label, bool observe) {
  const size_t count = bytes / sizeof(float);
  BufferPool::Buffer buf = pool_.acquire(count * sizeof(float));
  std::memset(buf.data(), 0, count * sizeof(float));
  collectives::CollectiveOptions copt = options(seq, timeout_s);
  auto start = std::chrono::steady_clock::now();
  allreduce_on(rail, buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, copt);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  completed_[rail] = seq + 1;
  if (table_ && observe) table_->observe(rail, count * sizeof(float), secs);
  if (observer_) observer_(rail, count * sizeof(float), start, secs, label);
}

void Executor::use_hierarchical(std::vector<transport::HierarchicalRail*> rails) {
  hierarchical_ = std::move(rails);
  if (!watchdog_) return;
  for (size_t r = 0; r < hierarchical_.size(); ++r) {
    const transport::HierarchicalRail* h = hierarchical_[r];
    // Across hosts a rank's network rail is silent while the other host's ranks still
    // reduce-scatter over shared memory, and (uneven placements) while the host with fewer ranks
    // serves the other slices' groups (collectives/hierarchy.h): on a loaded host such silences
    // outlast the default limit, which would take them for a cut cable. Such rails get a higher
    // floor; a cut is still found.
    if (h && h->hierarchical() && h->placement().hosts() > 1)
      watchdog_->set_min_silence(static_cast<int>(r), kHierarchyStallS);
  }
}

void Executor::allreduce_on(int rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                            const collectives::CollectiveOptions& copt) {
  transport::HierarchicalRail* h =
      static_cast<size_t>(rail) < hierarchical_.size() ? hierarchical_[static_cast<size_t>(rail)] : nullptr;
  if (h && h->hierarchical()) {
    // In place only: the copy writes the input itself, nothing before_overwrite must hear of.
    if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
    collectives::allreduce_hierarchical(h->host_lane(), h->network(), h->placement(), out, count, dtype, op, copt);
  } else {
    collectives::allreduce(*rails_[rail], in, out, count, dtype, op, copt);
  }
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
    job->fusion = pool_.acquire(total * esize);
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
    const size_t min_claim = opt_.balance_bytes / esize;
    job->balancer = std::make_unique<ShareBalancer>(plan, min_claim, align, min_claim / kMinClaimSpread);
    if (opt_.failover) job->original = originals_.acquire(total * esize);
  }
  job->parts_left = static_cast<int>(plan.size());
  for (size_t part = 0; part < plan.size(); ++part) {
    const multirail::RailShare& share = plan[part];
    auto rec = std::make_shared<ShareRecord>();
    rec->job = job;
    rec->share = share;
    rec->part = part;
    rec->seq = seq_[share.rail]++;
    if (opt_.failover) {
      std::lock_guard<std::mutex> lock(ledger_mu_);
      ledger_[share.rail].push_back(rec);
    }
    // Small lone payloads run on the engine thread when the rail is idle: a thread handoff costs
    // more than the whole log-step exchange.
    // With failover the engine thread must never wait on a rail: it is what reacts to the rail's
    // failure (and a rank blocked there would stall every other rail's redo).
    post_share(std::move(rec), !opt_.failover && plan.size() == 1 && share.count * esize <= opt_.inline_max_bytes);
  }
}

void Executor::post_share(std::shared_ptr<ShareRecord> rec, bool may_inline) {
  const int r = rec->share.rail;
  auto run = [this, rec]() {
    if (rec->skipped) run_skipped(*rec);
    else if (rec->single) run_single_record(*rec);
    else if (rec->job->balancer) run_balanced_share(*rec);
    else run_share(*rec);
  };
  if (!(may_inline && workers_[r]->try_run_inline(run))) workers_[r]->post(std::move(run));
}

void Executor::run_share(ShareRecord& rec) {
  AllreduceJob& job = *rec.job;
  const int r = rec.share.rail;
  transport::Rail* rail = rails_[r];
  std::optional<transport::GroupRail> set_view;  // a process set's operation: among its members
  if (job.members) rail = &set_view.emplace(*rail, *job.members);
  const size_t esize = dtype_size(job.resp.dtype);
  const size_t bytes = rec.share.count * esize;
  uint8_t* target = job.data + rec.share.offset * esize;
  const uint8_t* range = job.input + rec.share.offset * esize;  // the share's input (target in place)
  if (!share_may_run(rec)) return;
  record_started(rec, range, bytes);
  BufferPool::Buffer scratch;
  if (rec.into_scratch) {
    scratch = pool_.acquire(bytes);
    target = scratch.data();
  }
  // A redo rebuilds the input in target and runs in place there.
  if (rec.is_redo) restore_input(rec, target, range, bytes);
  const uint8_t* in = rec.is_redo ? target : range;

  collectives::CollectiveOptions copt = options(rec.seq, opt_.timeout_s);
  copt.postscale = effective_postscale(job.resp, job.size);
  if (rec.original.data()) {
    copt.before_overwrite = [this, &rec, in](size_t offset, size_t n) { save_before_overwrite(rec, in, offset, n); };
  }
  auto start = std::chrono::steady_clock::now();
  if (watchdog_) watchdog_->begin(r, "allreduce of " + names_str(job.resp));
  try {
    if (job.members)  // among the set's members: flat, over the set's view of the rail
      collectives::allreduce(*rail, in, target, rec.share.count, job.resp.dtype, job.resp.op, copt);
    else
      allreduce_on(r, in, target, rec.share.count, job.resp.dtype, job.resp.op, copt);
    if (watchdog_) watchdog_->end(r, true);
    record_done(rec);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (table_) table_->observe(r, bytes, secs);
    if (observer_) observer_(r, bytes, start, secs, (rec.is_redo ? "redo: " : "") + names_str(job.resp));
    if (!rec.into_scratch) part_done(job);
  } catch (const std::exception& e) {
    share_failed(rec, rail->properties().name, e.what());
  }
}

bool Executor::share_may_run(ShareRecord& rec) {
  AllreduceJob& job = *rec.job;
  if (job.finished && !rec.into_scratch) return false;
  if (fatal_) {  // fail_all: the job cannot go on; skipped, counted as failed
    if (!rec.into_scratch) fail_part(job, fatal_error(job.resp));
    return false;
  }
  return true;
}

void Executor::share_failed(ShareRecord& rec, const std::string& rail_name, const std::string& error) {
  AllreduceJob& job = *rec.job;
  if (watchdog_) watchdog_->end(rec.share.rail, false);
  std::string what = "allreduce of " + names_str(job.resp) + " failed on rail '" + rail_name + "': " + error;
  if (record_lost(rec, what)) return;
  if (rec.into_scratch) return;
  std::string fatal = fatal_error(job.resp);  // the cause, rather than the rail's abort
  fail_part(job, fatal.empty() ? what : fatal);
}

void Executor::part_done(AllreduceJob& job) {
  if (--job.parts_left == 0 && !job.finished.exchange(true)) finish_allreduce(job);
}

void Executor::fail_part(AllreduceJob& job, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (job.error.empty()) job.error = what;
  }
  part_done(job);
}

std::string Executor::fatal_error(const Response& resp) const {
  if (!fatal_) return {};
  std::lock_guard<std::mutex> lock(ledger_mu_);
  return std::string(op_type_name(resp.type)) + " of " + names_str(resp) + ": " + fatal_reason_;
}

void Executor::finish_allreduce(AllreduceJob& job) {
  if (!job.error.empty()) {
    NZ_LOG(Error) << job.error;
    for (auto& e : job.entries)
      if (e.handle) e.handle->complete(job.error);
    return;
  }
  const Response& resp = job.resp;
  const size_t esize = dtype_size(resp.dtype);
  size_t off = 0;  // the shares' collectives applied the postscale already
  for (size_t i = 0; i < job.entries.size(); ++i) {
    size_t count = static_cast<size_t>(resp.counts[i]);
    TensorEntry& e = job.entries[i];
    if (e.handle) {
      uint8_t* out = static_cast<uint8_t*>(e.output);
      if (out != job.data + off) std::memcpy(out, job.data + off, count * esize);
      e.handle->complete();
    }
    off += count * esize;
  }
}

}  // namespace nezha::engine
