// Executor: broadcast, allgather, alltoall and reducescatter striped over several rails.
//
// The plan gives each rail a share of the operation; the share carries the same proportion of
// every block the operation moves (striped_parts.h), so every rail finishes together as with an
// allreduce. A share reads and writes its parts of every block where they lie in the operation's
// input and output (the collectives' *_blocks forms): nothing is packed per rail or unpacked after.
// Each share is a record in its rail's ledger like any other: its parts of the input are copied,
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
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/striped_parts.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {

// The plan's total, the denominator of every part (the shares tile [0, total)).
size_t plan_total(const Response& resp) {
  size_t total = 0;
  for (const auto& s : resp.plan) total += s.count;
  return total;
}

}  // namespace

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

void Executor::run_striped(const Response& resp, std::vector<TensorEntry> entries,
                           std::shared_ptr<FusedTensors> fused) {
  auto job = std::make_shared<SingleJob>();
  job->resp = resp;
  job->entry = std::move(entries.at(0));
  job->fused = std::move(fused);
  job->members = members_of(resp);
  job->parts_left = static_cast<int>(resp.plan.size());
  // The output is sized (and its shape set) before any part writes its range of it.
  const auto [me, n] = place_among(job->members.get(), opt_.rank, opt_.size);
  const size_t esize = dtype_size(resp.dtype);
  OpResult& res = job->entry.handle->result();
  const std::vector<int64_t>& shape = job->entry.req.shape;
  if (resp.type == OpType::kAllgather) {
    int64_t rows = 0;
    for (int64_t r : resp.rank_rows) rows += r;
    res.output.resize(static_cast<size_t>(rows * resp.row_elements[0]) * esize);
    res.output_shape = with_rows(shape, rows);
  } else if (resp.type == OpType::kAlltoall) {
    int64_t rows = 0;
    res.received_splits.assign(n, 0);
    for (int i = 0; i < n; ++i) rows += (res.received_splits[i] = resp.splits_matrix[i * n + me]);
    res.output.resize(static_cast<size_t>(rows * resp.row_elements[0]) * esize);
    res.output_shape = with_rows(shape, rows);
  } else if (resp.type == OpType::kReducescatter) {
    res.output.resize(static_cast<size_t>(resp.rank_rows[me] * resp.row_elements[0]) * esize);
    res.output_shape = with_rows(shape, resp.rank_rows[me]);
  }
  // A range carries c / total of every block: an alltoall's range of c elements sends each peer
  // about c / n of them (one element less where rounding falls so), kept at least
  // kAlltoallPacedBytes so its messages stay paced (alltoall.cc: unpaced 64 KiB pieces of a 16 MB
  // alltoall among 16 ranks stalled 250 Mbit/s rails for a retransmission timeout, which the
  // watchdog took for a failed rail).
  const size_t min_range_bytes =
      resp.type == OpType::kAlltoall
          ? std::max(opt_.balance_bytes, static_cast<size_t>(n) * (collectives::kAlltoallPacedBytes + esize))
          : opt_.balance_bytes;
  if (balances(resp.plan, plan_total(resp) * esize, n, min_range_bytes)) {
    // A slower rail's ranges are smaller (share_balancer.h), but an alltoall's never below the paced size.
    const size_t min_claim = std::max<size_t>(1, min_range_bytes / esize);
    const size_t floor_claim = resp.type == OpType::kAlltoall ? min_claim : min_claim / kMinClaimSpread;
    job->balancer = std::make_unique<ShareBalancer>(resp.plan, min_claim, 1, floor_claim);
    const bool has_input = resp.type != OpType::kBroadcast || opt_.rank == resp.root;
    if (opt_.failover && has_input) job->original = originals_.acquire(single_input_bytes(*job));
  }
  for (size_t part = 0; part < resp.plan.size(); ++part) {
    const multirail::RailShare& share = resp.plan[part];
    auto rec = std::make_shared<ShareRecord>();
    rec->single = job;
    rec->striped = true;
    rec->share = share;
    rec->part = part;
    rec->seq = seq_[share.rail]++;
    if (opt_.failover) {
      std::lock_guard<std::mutex> lock(ledger_mu_);
      ledger_[share.rail].push_back(rec);
    }
    post_share(std::move(rec), false);
  }
}

void Executor::striped_part_done(SingleJob& job, const std::string& error) {
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(job.mu);
    if (job.error.empty()) job.error = error;
  }
  if (--job.parts_left == 0 && !job.finished.exchange(true)) {
    if (!job.error.empty()) NZ_LOG(Error) << job.error;
    complete_single(job, job.error);
  }
}

void Executor::run_striped_part(ShareRecord& rec) {
  SingleJob& job = *rec.single;
  const Response& resp = job.resp;
  const int r = rec.share.rail;
  if (job.finished && !rec.into_scratch) return;
  if (fatal_) {  // fail_all: skipped, counted as failed
    if (!rec.into_scratch) striped_part_done(job, fatal_error(resp));
    return;
  }
  std::optional<transport::GroupRail> set_view;
  transport::Rail* rail = rails_[r];
  if (job.members) rail = &set_view.emplace(*rail, *job.members);
  const std::string what = std::string(op_type_name(resp.type)) + " of " + names_str(resp);
  PartWatch watch(watchdog_.get(), r, what);
  try {
    if (job.balancer) {
      record_started(rec, nullptr, 0);  // each range saves its parts of the input (job.original)
      int leader = 0;  // a broadcast's: the chain's last rank (balanced_ranges.h)
      if (resp.type == OpType::kBroadcast) {
        const int root = place_among(job.members.get(), resp.root, rail->size()).first;
        leader = (root + rail->size() - 1) % rail->size();
      }
      for_each_balanced_range(*rail, leader, *job.balancer, rec.part, rec.seq, rec.is_redo, plan_total(resp),
                              opt_.timeout_s,
                              [&](const ShareBalancer::Range& range) {
                                run_striped_range(rec, *rail, range.offset, range.count, watch);
                              },
                              // Unwatched while waiting for a claim: the leader, in its range, is
                              // watched, and a rail lost there is failed over on every rank.
                              [&](bool on) { on ? watch.pause() : watch.resume(); });
    } else {
      run_striped_range(rec, *rail, rec.share.offset, rec.share.count, watch);
    }
    watch.end(true);
    record_done(rec);
    if (!rec.into_scratch) striped_part_done(job, "");
  } catch (const std::exception& ex) {
    watch.end(false);
    std::string msg = what + " failed on rail '" + rails_[r]->properties().name + "': " + ex.what();
    if (record_lost(rec, msg)) return;
    if (rec.into_scratch) return;
    std::string fatal = fatal_error(resp);  // the cause, rather than the rail's abort
    striped_part_done(job, fatal.empty() ? msg : fatal);
  }
}

void Executor::run_striped_range(ShareRecord& rec, transport::Rail& rail, size_t offset, size_t count,
                                 PartWatch& watch) {
  SingleJob& job = *rec.single;
  const Response& resp = job.resp;
  TensorEntry& e = job.entry;
  const int me = rail.rank(), n = rail.size();
  const size_t esize = dtype_size(resp.dtype);
  const size_t total = plan_total(resp);
  auto part = [&](size_t block) { return block_part(block, offset, count, total); };
  const bool balanced = job.balancer != nullptr;
  const auto* in = static_cast<const uint8_t*>(e.input);
  OpResult& res = e.handle->result();
  collectives::CollectiveOptions copt = options(rec.seq, opt_.timeout_s);

  // Where this share's part of each block is read and written: in the caller's input and the
  // operation's output, in place (collectives' *_blocks forms), so nothing is packed per rail and
  // unpacked after. With failover the parts of the input are copied once: packed, on a planned
  // share's first run (record_started; a redo reads that copy), or at their own offsets into the
  // job's copy as a balanced range runs (see the top of this file).
  BufferPool::Buffer scratch, work;
  const uint8_t* input = nullptr;  // broadcast's root, allgather: this rank's contiguous part
  size_t input_bytes = 0, input_at = 0;  // input_at: the part's offset in the caller's input, bytes
  std::vector<BlockPart> send_parts(n), recv_parts(n);
  std::vector<size_t> send_offsets(n, 0), recv_offsets(n, 0);  // of each block, in elements
  size_t row = resp.row_elements.empty() ? 1 : static_cast<size_t>(resp.row_elements[0]);
  int root = -1;
  switch (resp.type) {
    case OpType::kBroadcast: {
      root = place_among(job.members.get(), resp.root, n).first;
      const BlockPart p = part(static_cast<size_t>(resp.counts[0]));
      send_parts[0] = p;
      if (me == root) {
        input_at = p.begin * esize;
        input_bytes = p.count * esize;
      }
      break;
    }
    case OpType::kAllgather: {
      size_t off = 0;
      for (int i = 0; i < n; ++i) {
        const size_t block = static_cast<size_t>(resp.rank_rows[i]) * row;
        recv_parts[i] = part(block);
        recv_offsets[i] = off;
        off += block;
      }
      input_at = recv_parts[me].begin * esize;
      input_bytes = recv_parts[me].count * esize;
      break;
    }
    case OpType::kReducescatter:
    case OpType::kAlltoall: {
      // Blocks of the input in rank order: reducescatter's rows per rank, alltoall's splits.
      size_t off = 0, roff = 0;
      for (int i = 0; i < n; ++i) {
        const size_t block = resp.type == OpType::kReducescatter
                                 ? static_cast<size_t>(resp.rank_rows[i]) * row
                                 : static_cast<size_t>(resp.splits_matrix[me * n + i]) * row;
        send_parts[i] = part(block);
        send_offsets[i] = off;
        off += block;
        if (resp.type == OpType::kAlltoall) {
          const size_t rblock = static_cast<size_t>(resp.splits_matrix[i * n + me]) * row;
          recv_parts[i] = part(rblock);
          recv_offsets[i] = roff;
          roff += rblock;
        }
      }
      for (const auto& p : send_parts) input_bytes += p.count * esize;
      break;
    }
    default:
      throw NezhaError(std::string("unexpected striped operation ") + op_type_name(resp.type));
  }
  const bool packs = resp.type == OpType::kAlltoall || resp.type == OpType::kReducescatter;
  // The byte offset in the input of the part this share sends to rank i (alltoall, reducescatter).
  auto part_at = [&](int i) { return (send_offsets[i] + send_parts[i].begin) * esize; };
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  for (int i = 0; i < n; ++i) {
    send_bytes[i] = send_parts[i].count * esize;
    recv_bytes[i] = recv_parts[i].count * esize;
  }
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
    if (rec.into_scratch && saved) {
      base = saved;
    } else if (saved) {  // keep this range's parts for a redo, at their own offsets
      if (packs)
        for (int i = 0; i < n; ++i) std::memcpy(saved + part_at(i), in + part_at(i), send_bytes[i]);
      else if (input_bytes > 0)
        std::memcpy(saved + input_at, in + input_at, input_bytes);
    }
    if (input_bytes > 0 && !packs) input = base + input_at;
    if (packs)
      for (int i = 0; i < n; ++i) send_at[i] = base + part_at(i);
  } else {
    if (input_bytes > 0 && !packs) input = in + input_at;
    auto pack = [&](uint8_t* to) {
      for (int i = 0; i < n; ++i) {
        std::memcpy(to, in + part_at(i), send_bytes[i]);
        to += send_bytes[i];
      }
    };
    record_started(rec, input, input_bytes, packs ? std::function<void(uint8_t*)>(pack) : nullptr);
    const bool kept = rec.original.data() && input_bytes > 0;
    if (kept && !packs) input = rec.original.data();
    if (packs) {
      const std::vector<uint8_t*> copy = kept ? consecutive(rec.original.data(), send_bytes) : std::vector<uint8_t*>();
      for (int i = 0; i < n; ++i) send_at[i] = kept ? copy[i] : in + part_at(i);
    }
  }
  // Where the parts this share receives go: their block's range of the output, or scratch for a
  // rank that takes part in a redo of what it already delivered.
  auto received_at = [&] {
    if (rec.into_scratch) {
      size_t sum = 0;
      for (size_t b : recv_bytes) sum += b;
      scratch = pool_.acquire(sum);
      return consecutive(scratch.data(), recv_bytes);
    }
    std::vector<uint8_t*> at(n);
    for (int i = 0; i < n; ++i) at[i] = res.output.data() + (recv_offsets[i] + recv_parts[i].begin) * esize;
    return at;
  };

  watch.resume();
  const auto start = std::chrono::steady_clock::now();
  size_t moved = input_bytes;  // for the timeline: what this share carries of the operation
  for (size_t b : recv_bytes) moved += b;
  switch (resp.type) {
    case OpType::kBroadcast: {
      const size_t bytes = send_parts[0].count * esize;
      moved = bytes;
      uint8_t* target = static_cast<uint8_t*>(e.output) + send_parts[0].begin * esize;
      if (rec.into_scratch) {
        scratch = pool_.acquire(bytes);
        target = scratch.data();
      }
      if (me == root && target != input) std::memcpy(target, input, bytes);
      collectives::broadcast(rail, target, bytes, root, copt);
      break;
    }
    case OpType::kAllgather:
      collectives::allgatherv_blocks(rail, input, received_at(), recv_bytes, copt);
      break;
    case OpType::kAlltoall:
      collectives::alltoallv_blocks(rail, send_at, send_bytes, received_at(), recv_bytes, copt);
      break;
    case OpType::kReducescatter: {
      // Partial sums go to a work buffer (packed), this rank's block straight to the output.
      work = pool_.acquire(input_bytes);
      std::vector<uint8_t*> work_at = consecutive(work.data(), send_bytes);
      if (resp.prescale != 1.0) {  // the scaled input is reduced in place in the work buffer
        for (int i = 0; i < n; ++i) std::memcpy(work_at[i], send_at[i], send_bytes[i]);
        collectives::scale(work.data(), input_bytes / esize, resp.dtype, resp.prescale);
        send_at.assign(work_at.begin(), work_at.end());
      }
      uint8_t* mine = nullptr;
      if (rec.into_scratch) {
        scratch = pool_.acquire(send_bytes[me]);
        mine = scratch.data();
      } else {
        mine = res.output.data() + send_parts[me].begin * esize;
      }
      work_at[me] = mine;
      std::vector<size_t> counts(n);
      for (int i = 0; i < n; ++i) counts[i] = send_parts[i].count;
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
  if (observer_)
    observer_(rec.share.rail, moved, start,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              (rec.is_redo ? "redo: " : "") + std::string(op_type_name(resp.type)) + " of " + names_str(resp));
}

}  // namespace nezha::engine
