// StripedPart (task_kinds.h): one rail's part of a broadcast, allgather, alltoall or reducescatter
// striped over several rails.
//
// The plan gives each rail a share of the operation; the share carries the same proportion of
// every block the operation moves (striped_parts.h), so every rail finishes together as with an
// allreduce. A share reads and writes its parts of every block where they lie in the operation's
// input and output (the collectives' *_blocks forms): nothing is packed per rail or unpacked after.
// Each part is a task in its rail's ledger like any other: its parts of the input are copied,
// packed, when it first runs, and a share lost with its rail is redone on a survivor from that copy
// (inputs are never overwritten: every output here is separate, an in-place broadcast's receivers
// excepted, and receivers need no input; a redo rewrites the same output ranges with the same
// bytes). A rank that had completed a share takes part in its redo into scratch memory, leaving
// what it delivered alone.
//
// Balanced (Executor::balances, as for allreduce): the plan's shares are the pools of a
// ShareBalancer over the plan's [0, total) and each rail's part runs range by range as the leader
// hands them out (balanced_ranges.h); a range [o, o + c) carries the same proportion c / total of
// every block as a share would, so ranges of different rails tile every block exactly and a rail
// that slows down hands its rest to the others. With failover each range's parts of the input are
// saved as the range first runs into the job's copy, at their own offsets (ranges never overlap);
// a redo reads the caller's input while the job runs here, and that copy when this rank runs it
// for the others (it then ran those very ranges, and saved them).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/execution/balanced_ranges.h"
#include "engine/execution/striped_parts.h"
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {

// The rail's silence is watched while a part communicates (a leader's claims included), not while
// this rank copies its input for a redo, scales what it received or waits for a claim: steps that
// move no byte and, on 2 busy cores, can outlast the 100 ms the watchdog allows a silent rail. Its
// link is watched throughout: a rank waiting for a claim its cut link will never bring (the leader
// sent "nothing left" and is done with the part) is reported by its carrier, not by nobody.
class PartWatch {
 public:
  PartWatch(RailWatchdog* watchdog, int rail, std::string what)
      : watchdog_(watchdog), rail_(rail), what_(std::move(what)) {
    resume();
  }
  void pause() {
    if (on_ && !paused_) watchdog_->pause(rail_);
    paused_ = on_;
  }
  void resume() {
    if (watchdog_ && (!on_ || paused_)) watchdog_->begin(rail_, what_);
    on_ = watchdog_ != nullptr;
    paused_ = false;
  }
  void end(bool ok) {
    if (on_) watchdog_->end(rail_, ok);
    on_ = paused_ = false;
  }

 private:
  RailWatchdog* watchdog_;
  int rail_;
  std::string what_;
  bool on_ = false;
  bool paused_ = false;
};

void SingleJob::part_done(const std::string& err) {
  if (!err.empty()) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = err;
  }
  if (--parts_left == 0 && !finished.exchange(true)) {
    if (!error.empty()) NZ_LOG(Error) << error;
    complete(error);
  }
}

void StripedPart::run(TaskContext& ctx) {
  SingleJob& job = *job_;
  const Response& resp = job.resp;
  const int r = rail();
  if (job.finished && !for_others()) return;
  if (ctx.fatal()) {  // fail_all: skipped, counted as failed
    if (!for_others()) job.part_done(ctx.fatal_error(resp));
    return;
  }
  std::optional<transport::GroupRail> set_view;
  const std::string what = std::string(op_type_name(resp.type)) + " of " + names_str(resp);
  PartWatch watch(ctx.watchdog.get(), r, what);
  try {
    transport::PointToPointRail* rail = &ctx.point_to_point(r, op_type_name(resp.type));
    if (job.members) rail = &set_view.emplace(*rail, *job.members);
    if (job.balancer) {
      ctx.started(*this);  // each range saves its parts of the input (job.original)
      int leader = 0;  // a broadcast's: the chain's last rank (balanced_ranges.h)
      if (resp.type == OpType::kBroadcast) {
        const int root = place_among(job.members.get(), resp.root, rail->size()).first;
        leader = (root + rail->size() - 1) % rail->size();
      }
      for_each_balanced_range(*rail, leader, *job.balancer, part_, seq, is_redo(), plan_total(resp),
                              ctx.opt.timeout_s,
                              [&](const ShareBalancer::Range& range) {
                                run_range(ctx, *rail, range.offset, range.count, watch);
                              },
                              // Unwatched while waiting for a claim: the leader, in its range, is
                              // watched, and a rail lost there is failed over on every rank.
                              [&](bool on) { on ? watch.pause() : watch.resume(); });
    } else {
      run_range(ctx, *rail, share_.offset, share_.count, watch);
    }
    watch.end(true);
    ctx.done(*this);
    if (!for_others()) job.part_done("");
  } catch (const std::exception& ex) {
    watch.end(false);
    std::string msg = what + " failed on rail '" + ctx.rails[r]->properties().name + "': " + ex.what();
    if (ctx.lost(*this, msg)) return;
    if (for_others()) return;
    std::string fatal = ctx.fatal_error(resp);  // the cause, rather than the rail's abort
    job.part_done(fatal.empty() ? msg : fatal);
  }
}

std::unique_ptr<ShareTask> StripedPart::redo_on(int target, Pass pass, TaskContext&) {
  // An operation that ended here without this part (failed for good) has nothing to redo.
  if (pass == Pass::kRedo && job_->finished) return nullptr;
  multirail::RailShare share = share_;
  share.rail = target;
  auto redo = std::make_unique<StripedPart>(job_, share, part_, pass);
  // Planned: the packed copy, once it has started (before, the caller's input is intact).
  // Balanced: the ranges' parts are in the job's copy.
  redo->original_ = std::move(original_);
  return redo;
}

void StripedPart::abandon(TaskContext& ctx) { job_->part_done(ctx.fatal_error(job_->resp)); }

void StripedPart::run_range(TaskContext& ctx, transport::PointToPointRail& rail, size_t offset, size_t count,
                            PartWatch& watch) {
  SingleJob& job = *job_;
  const Response& resp = job.resp;
  TensorEntry& e = job.entry;
  const int me = rail.rank(), n = rail.size();
  const size_t esize = dtype_size(resp.dtype);
  const int root = resp.type == OpType::kBroadcast ? place_among(job.members.get(), resp.root, n).first : -1;
  const StripedLayout l = striped_layout(resp, me, n, root, offset, count, plan_total(resp));
  const bool balanced = job.balancer != nullptr;
  const int rail_index = this->rail();
  const auto* in = static_cast<const uint8_t*>(e.input);
  OpResult& res = e.handle->result();
  collectives::CollectiveOptions copt = ctx.collective_options(seq, ctx.opt.timeout_s);

  // Where this share's part of each block is read and written: in the caller's input and the
  // operation's output, in place (collectives' *_blocks forms), so nothing is packed per rail and
  // unpacked after. With failover the parts of the input are copied once: packed, on a planned
  // share's first run (a redo reads that copy), or at their own offsets into the
  // job's copy as a balanced range runs (see the top of this file).
  BufferPool::Buffer scratch, work;
  const uint8_t* input = nullptr;  // broadcast's root, allgather: this rank's contiguous part
  // Consecutive parts of `sizes` bytes starting at `base` (a packed buffer's blocks).
  auto consecutive = [&](uint8_t* base, const std::vector<size_t>& sizes) {
    std::vector<uint8_t*> at(n);
    for (int i = 0; i < n; ++i) {
      at[i] = base;
      base += sizes[i];
    }
    return at;
  };
  // Where the parts this share sends are read: the caller's input, or a kept copy. Copying moves
  // no byte on the rail: unwatched (a large copy on busy cores outlasts the silence limit).
  watch.pause();
  std::vector<const uint8_t*> send_at(n);
  if (balanced) {
    uint8_t* saved = job.original.data();
    const uint8_t* base = in;
    if (for_others() && saved) {
      base = saved;
    } else if (saved) {  // keep this range's parts for a redo, at their own offsets
      if (l.packs) {
        for (int i = 0; i < n; ++i) {
          std::memcpy(saved + l.send_at[i], in + l.send_at[i], l.send_bytes[i]);
          ctx.kept_bytes += l.send_bytes[i];
        }
      } else if (l.input_bytes > 0) {
        std::memcpy(saved + l.input_at, in + l.input_at, l.input_bytes);
        ctx.kept_bytes += l.input_bytes;
      }
    }
    if (l.input_bytes > 0 && !l.packs) input = base + l.input_at;
    if (l.packs)
      for (int i = 0; i < n; ++i) send_at[i] = base + l.send_at[i];
  } else {
    if (l.input_bytes > 0 && !l.packs) input = in + l.input_at;
    auto pack = [&](uint8_t* to) {
      for (int i = 0; i < n; ++i) {
        std::memcpy(to, in + l.send_at[i], l.send_bytes[i]);
        to += l.send_bytes[i];
      }
    };
    ctx.started(*this);
    if (ctx.opt.failover && !original_.data() && l.input_bytes > 0) {  // first run: keep the input
      original_ = ctx.originals.acquire(l.input_bytes);
      if (l.packs) pack(original_.data());
      else std::memcpy(original_.data(), input, l.input_bytes);
      ctx.kept_bytes += l.input_bytes;
    }
    const bool kept = original_.data() && l.input_bytes > 0;
    if (kept && !l.packs) input = original_.data();
    if (l.packs) {
      const std::vector<uint8_t*> copy = kept ? consecutive(original_.data(), l.send_bytes) : std::vector<uint8_t*>();
      for (int i = 0; i < n; ++i) send_at[i] = kept ? copy[i] : in + l.send_at[i];
    }
  }
  // Where the parts this share receives go: their block's range of the output, or scratch for a
  // rank that takes part in a redo of what it already delivered.
  auto received_at = [&] {
    if (for_others()) {
      size_t sum = 0;
      for (size_t b : l.recv_bytes) sum += b;
      scratch = ctx.pool.acquire(sum);
      return consecutive(scratch.data(), l.recv_bytes);
    }
    std::vector<uint8_t*> at(n);
    for (int i = 0; i < n; ++i) at[i] = res.output.data() + l.recv_at[i];
    return at;
  };

  watch.resume();
  const auto start = std::chrono::steady_clock::now();
  size_t moved = l.input_bytes;  // for the timeline: what this share carries of the operation
  for (size_t b : l.recv_bytes) moved += b;
  switch (resp.type) {
    case OpType::kBroadcast: {
      moved = l.output_bytes;
      uint8_t* target = static_cast<uint8_t*>(e.output) + l.output_at;
      if (for_others()) {
        scratch = ctx.pool.acquire(l.output_bytes);
        target = scratch.data();
      }
      if (me == root && target != input) std::memcpy(target, input, l.output_bytes);
      collectives::broadcast(rail, target, l.output_bytes, root, copt);
      break;
    }
    case OpType::kAllgather:
      collectives::allgatherv_blocks(rail, input, received_at(), l.recv_bytes, copt);
      break;
    case OpType::kAlltoall:
      collectives::alltoallv_blocks(rail, send_at, l.send_bytes, received_at(), l.recv_bytes, copt);
      break;
    case OpType::kReducescatter: {
      // Partial sums go to a work buffer (packed), this rank's block straight to the output.
      work = ctx.pool.acquire(l.input_bytes);
      std::vector<uint8_t*> work_at = consecutive(work.data(), l.send_bytes);
      if (resp.prescale != 1.0) {  // the scaled input is reduced in place in the work buffer
        for (int i = 0; i < n; ++i) std::memcpy(work_at[i], send_at[i], l.send_bytes[i]);
        collectives::scale(work.data(), l.input_bytes / esize, resp.dtype, resp.prescale);
        send_at.assign(work_at.begin(), work_at.end());
      }
      uint8_t* mine = nullptr;
      if (for_others()) {
        scratch = ctx.pool.acquire(l.output_bytes);
        mine = scratch.data();
      } else {
        mine = res.output.data() + l.output_at;
      }
      work_at[me] = mine;
      std::vector<size_t> counts(n);
      for (int i = 0; i < n; ++i) counts[i] = l.send_bytes[i] / esize;
      collectives::reducescatterv_blocks(rail, send_at, work_at, counts, resp.dtype, resp.op, copt);
      const double post = effective_postscale(resp, n);
      if (post != 1.0) {
        watch.pause();
        collectives::scale(mine, counts[me], resp.dtype, post);
        watch.resume();
      }
      break;
    }
    default:
      break;
  }
  // The timeline only: the rails' cost models fit allreduce's ring, not these patterns.
  ctx.observe(rail_index, moved, start,
              (is_redo() ? "redo: " : "") + std::string(op_type_name(resp.type)) + " of " + names_str(resp),
              /*measure=*/false);
}

}  // namespace nezha::engine
