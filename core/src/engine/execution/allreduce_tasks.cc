// The allreduce tasks (task_kinds.h): a share as the plan split it (AllreduceShare) and a part of
// a balanced allreduce (BalancedRange), and the job they complete together.
//
// A balanced part runs on its rail's worker, on every rank, range by range as the leader hands them
// out (balanced_ranges.h). A redo (the part's rail failed) runs exactly the ranges the leader had
// handed the part, in order, on the redo's rail; the pool itself is left to the rails still running
// (what nobody started is taken by them, with no redo).
#include <chrono>
#include <cstring>
#include <optional>

#include "collectives/collectives.h"
#include "common/logging.h"
#include "engine/execution/balanced_ranges.h"
#include "engine/execution/call_timing_rail.h"
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {

// Before an allreduce task runs: false when it must not (its job finished; with fail_all, it is
// counted as failed).
bool may_run(const ShareTask& task, AllreduceJob& job, TaskContext& ctx) {
  if (job.finished && !task.for_others()) return false;
  if (ctx.fatal()) {  // fail_all: the job cannot go on; skipped, counted as failed
    if (!task.for_others()) job.fail_part(ctx.fatal_error(job.resp));
    return false;
  }
  return true;
}

// An allreduce task threw on `rail_name`: ends the watchdog's watch, then marks the task lost for a
// redo, or fails its part for good (naming the cause fail_all gave, if any).
void failed(ShareTask& task, AllreduceJob& job, TaskContext& ctx, const std::string& rail_name,
            const std::string& error) {
  if (ctx.watchdog) ctx.watchdog->end(task.rail(), false);
  std::string what = "allreduce of " + names_str(job.resp) + " failed on rail '" + rail_name + "': " + error;
  if (ctx.lost(task, what)) return;
  if (task.for_others()) return;
  std::string fatal = ctx.fatal_error(job.resp);  // the cause, rather than the rail's abort
  job.fail_part(fatal.empty() ? what : fatal);
}

std::string label(const ShareTask& task, const Response& resp) {
  return (task.is_redo() ? "redo: " : "") + names_str(resp);
}

}  // namespace

void AllreduceJob::part_done() {
  if (--parts_left == 0 && !finished.exchange(true)) finish();
}

void AllreduceJob::fail_part(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = what;
  }
  part_done();
}

void AllreduceJob::finish() {
  if (!error.empty()) {
    NZ_LOG(Error) << error;
    for (auto& e : entries)
      if (e.handle) e.handle->complete(error);
    return;
  }
  if (timed_by) {
    size_t total = 0;
    for (int64_t c : resp.counts) total += static_cast<size_t>(c);
    timed_by->observe_operation(total * dtype_size(resp.dtype), striped,
                                std::chrono::duration<double>(Clock::now() - posted).count());
  }
  const size_t esize = dtype_size(resp.dtype);
  size_t off = 0;  // the shares' collectives applied the postscale already
  for (size_t i = 0; i < entries.size(); ++i) {
    size_t count = static_cast<size_t>(resp.counts[i]);
    TensorEntry& e = entries[i];
    if (e.handle) {
      uint8_t* out = static_cast<uint8_t*>(e.output);
      if (out != data + off) std::memcpy(out, data + off, count * esize);
      e.handle->complete();
    }
    off += count * esize;
  }
}

void AllreduceShare::run(TaskContext& ctx) {
  AllreduceJob& job = *job_;
  const int r = rail();
  const std::string& rail_name = ctx.rails[r]->properties().name;
  std::optional<transport::GroupRail> set_view;  // a process set's operation: among its members
  const size_t esize = dtype_size(job.resp.dtype);
  const size_t bytes = share_.count * esize;
  uint8_t* target = job.data + share_.offset * esize;
  const uint8_t* range = job.input + share_.offset * esize;  // the share's input (target in place)
  if (!may_run(*this, job, ctx)) return;
  ctx.started(*this);
  // First run with failover: room for the input, saved range by range as the ring overwrites it.
  if (ctx.opt.failover && !original_.data() && bytes > 0) original_ = ctx.originals.acquire(bytes);
  BufferPool::Buffer scratch;
  if (for_others()) {
    scratch = ctx.pool.acquire(bytes);
    target = scratch.data();
  }
  if (is_redo()) {
    // The input, rebuilt in target (run in place there): bytes never overwritten still hold it in
    // the job's input (`range`; copied only when rebuilding elsewhere), the others were saved.
    if (target != range)
      saved_.for_each_gap(bytes, [&](size_t b, size_t e) { std::memcpy(target + b, range + b, e - b); });
    const uint8_t* copy = original_.data();
    saved_.for_each([&](size_t b, size_t e) { std::memcpy(target + b, copy + b, e - b); });
  }
  const uint8_t* in = is_redo() ? target : range;

  collectives::CollectiveOptions copt = ctx.collective_options(seq, ctx.opt.timeout_s);
  copt.postscale = effective_postscale(job.resp, job.size);
  if (original_.data()) {
    copt.before_overwrite = [this, in, &ctx](size_t offset, size_t n) {
      uint8_t* copy = original_.data();
      saved_.save(offset, offset + n, [&](size_t b, size_t e) {
        std::memcpy(copy + b, in + b, e - b);
        ctx.kept_bytes += e - b;
      });
    };
  }
  std::vector<double> calls;  // the receiving calls' times: what waited for a late peer
  auto start = std::chrono::steady_clock::now();
  if (ctx.watchdog) ctx.watchdog->begin(r, "allreduce of " + names_str(job.resp));
  try {
    if (job.members) {  // among the set's members: flat, over the set's view of the rail
      CallTimingRail timed(ctx.point_to_point(r, "allreduce of a process set"), calls);
      collectives::allreduce(set_view.emplace(timed, *job.members), in, target, share_.count, job.resp.dtype,
                             job.resp.op, copt);
    } else {
      ctx.allreduce_on(r, in, target, share_.count, job.resp.dtype, job.resp.op, copt, &calls);
    }
    if (ctx.watchdog) ctx.watchdog->end(r, true);
    ctx.done(*this);
    ctx.observe(r, bytes, start, label(*this, job.resp), /*measure=*/true, &calls);
    if (!for_others()) job.part_done();
  } catch (const std::exception& e) {
    failed(*this, job, ctx, rail_name, e.what());
  }
}

std::unique_ptr<ShareTask> AllreduceShare::redo_on(int target, Pass pass, TaskContext& ctx) {
  multirail::RailShare share = share_;
  share.rail = target;
  auto redo = std::make_unique<AllreduceShare>(job_, share, pass);
  if (original_.data()) {
    redo->original_ = std::move(original_);
    redo->saved_ = std::move(saved_);
  } else if (redo_bytes() > 0) {
    // Never started here: the input is still intact in the job's buffer, where the redo saves it
    // range by range.
    redo->original_ = ctx.originals.acquire(redo_bytes());
  }
  return redo;
}

void AllreduceShare::abandon(TaskContext& ctx) { job_->fail_part(ctx.fatal_error(job_->resp)); }

size_t AllreduceShare::redo_bytes() const { return share_.count * dtype_size(job_->resp.dtype); }

void BalancedRange::run(TaskContext& ctx) {
  AllreduceJob& job = *job_;
  const int r = rail();
  std::optional<transport::GroupRail> set_view;  // a process set's operation: among its members
  if (!may_run(*this, job, ctx)) return;
  ctx.started(*this);  // the input is saved range by range, in job.original
  size_t total = 0;
  for (int64_t c : job.resp.counts) total += static_cast<size_t>(c);
  if (ctx.watchdog) ctx.watchdog->begin(r, "allreduce of " + names_str(job.resp));
  try {
    transport::PointToPointRail* rail = &ctx.point_to_point(r, "balanced allreduce");
    if (job.members) rail = &set_view.emplace(*rail, *job.members);
    for_each_balanced_range(*rail, /*leader=*/0, *job.balancer, part_, seq, is_redo(), total, ctx.opt.timeout_s,
                            [&](const ShareBalancer::Range& range) { run_range(ctx, *rail, range); });
    if (ctx.watchdog) ctx.watchdog->end(r, true);
    ctx.done(*this);
    if (!for_others()) job.part_done();
  } catch (const std::exception& e) {
    failed(*this, job, ctx, ctx.rails[r]->properties().name, e.what());
  }
}

void BalancedRange::run_range(TaskContext& ctx, transport::PointToPointRail& rail, const ShareBalancer::Range& range) {
  AllreduceJob& job = *job_;
  const int r = this->rail();
  const size_t esize = dtype_size(job.resp.dtype);
  const size_t begin = range.offset * esize, bytes = range.count * esize;
  uint8_t* target = job.data + begin;
  const uint8_t* source = job.input + begin;  // the range's input (target itself in place)
  BufferPool::Buffer scratch;
  if (for_others()) {  // this rank has the result already: run for the others, keep nothing
    scratch = ctx.pool.acquire(bytes);
    target = scratch.data();
  }
  if (is_redo()) {
    // The input, rebuilt in target (run in place there): bytes never overwritten are still in the
    // job's input, the others were saved.
    if (target != source)
      saved_.for_each_gap(begin, begin + bytes,
                          [&](size_t b, size_t e) { std::memcpy(target + (b - begin), source + (b - begin), e - b); });
    const uint8_t* copy = job.original.data();
    saved_.for_each([&](size_t b, size_t e) {
      b = std::max(b, begin);
      e = std::min(e, begin + bytes);
      if (b < e) std::memcpy(target + (b - begin), copy + b, e - b);
    });
  }
  const uint8_t* in = is_redo() ? target : source;
  collectives::CollectiveOptions copt = ctx.collective_options(seq, ctx.opt.timeout_s);
  copt.postscale = effective_postscale(job.resp, job.size);
  if (job.original.data()) {
    copt.before_overwrite = [this, in, begin, &ctx](size_t offset, size_t n) {
      uint8_t* copy = job_->original.data();
      saved_.save(begin + offset, begin + offset + n, [&](size_t b, size_t e) {
        std::memcpy(copy + b, in + (b - begin), e - b);
        ctx.kept_bytes += e - b;
      });
    };
  }
  std::vector<double> calls;  // the receiving calls' times: what waited for a late peer
  auto start = std::chrono::steady_clock::now();
  if (job.members) {  // among the set's members: flat, over the set's view of the rail
    CallTimingRail timed(rail, calls);
    collectives::allreduce(timed, in, target, range.count, job.resp.dtype, job.resp.op, copt);
  } else {
    ctx.allreduce_on(r, in, target, range.count, job.resp.dtype, job.resp.op, copt, &calls);
  }
  ctx.observe(r, bytes, start, label(*this, job.resp), /*measure=*/true, &calls);
}

std::unique_ptr<ShareTask> BalancedRange::redo_on(int target, Pass pass, TaskContext&) {
  auto redo = std::make_unique<BalancedRange>(job_, target, part_, pass);
  redo->saved_ = std::move(saved_);
  return redo;
}

void BalancedRange::abandon(TaskContext& ctx) { job_->fail_part(ctx.fatal_error(job_->resp)); }

}  // namespace nezha::engine
