// Executor: broadcast, allgather, alltoall and reducescatter striped over several rails.
//
// The plan gives each rail a share of the operation; the share carries the same proportion of
// every block the operation moves (striped_parts.h), so every rail finishes together as with an
// allreduce. A share reads and writes its parts of every block where they lie in the operation's
// input and output (the collectives' *_blocks forms): nothing is packed per rail or unpacked after.
// Each share is a record in its rail's ledger like any other: its parts of the input are copied,
// packed, when it first runs, and a share lost with its rail is redone on a survivor from that copy
// (inputs are never overwritten: every output here is separate, an in-place broadcast's receivers
// excepted, and receivers need no input; a redo rewrites the same output ranges with the same bytes). A rank that had completed a share
// takes part in its redo into scratch memory, leaving what it delivered alone.
#include <algorithm>
#include <cstring>
#include <optional>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/striped_parts.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {

// The plan's total, the denominator of every part (the shares tile [0, total)).
size_t plan_total(const Response& resp) {
  size_t total = 0;
  for (const auto& s : resp.plan) total += s.count;
  return total;
}

// This rank's index among the ranks taking part, and their number.
std::pair<int, int> place(const std::vector<int>* members, int rank, int size) {
  if (!members) return {rank, size};
  const auto it = std::find(members->begin(), members->end(), rank);
  return {static_cast<int>(it - members->begin()), static_cast<int>(members->size())};
}

}  // namespace

void Executor::run_striped(const Response& resp, std::vector<TensorEntry> entries) {
  auto job = std::make_shared<SingleJob>();
  job->resp = resp;
  job->entry = std::move(entries.at(0));
  job->members = members_of(resp);
  job->parts_left = static_cast<int>(resp.plan.size());
  // The output is sized (and its shape set) before any part writes its range of it.
  const auto [me, n] = place(job->members.get(), opt_.rank, opt_.size);
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
  for (const auto& share : resp.plan) {
    auto rec = std::make_shared<ShareRecord>();
    rec->single = job;
    rec->striped = true;
    rec->share = share;
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
    job.entry.handle->complete(job.error);
  }
}

void Executor::run_striped_part(ShareRecord& rec) {
  SingleJob& job = *rec.single;
  const Response& resp = job.resp;
  TensorEntry& e = job.entry;
  const int r = rec.share.rail;
  if (job.finished && !rec.into_scratch) return;
  if (fatal_) {  // fail_all: skipped, counted as failed
    if (!rec.into_scratch) striped_part_done(job, fatal_error(resp));
    return;
  }
  std::optional<transport::GroupRail> set_view;
  transport::Rail* rail = rails_[r];
  if (job.members) rail = &set_view.emplace(*rail, *job.members);
  const int me = rail->rank(), n = rail->size();
  const size_t esize = dtype_size(resp.dtype);
  const size_t total = plan_total(resp);
  auto part = [&](size_t block) { return block_part(block, rec.share.offset, rec.share.count, total); };
  const auto* in = static_cast<const uint8_t*>(e.input);
  OpResult& res = e.handle->result();
  const std::string what = std::string(op_type_name(resp.type)) + " of " + names_str(resp);
  collectives::CollectiveOptions copt = options(rec.seq, opt_.timeout_s);

  // Where this share's part of each block is read and written: in the caller's input and the
  // operation's output, in place (collectives' *_blocks forms), so nothing is packed per rail and
  // unpacked after. With failover the parts of the input are copied once, packed, on the share's
  // first run (record_started), and a redo reads that copy.
  BufferPool::Buffer scratch, work;
  const uint8_t* input = nullptr;  // broadcast's root, allgather: this rank's contiguous part
  size_t input_bytes = 0;
  std::vector<BlockPart> send_parts(n), recv_parts(n);
  std::vector<size_t> send_offsets(n, 0), recv_offsets(n, 0);  // of each block, in elements
  size_t row = resp.row_elements.empty() ? 1 : static_cast<size_t>(resp.row_elements[0]);
  int root = -1;
  switch (resp.type) {
    case OpType::kBroadcast: {
      root = resp.root;
      if (job.members)
        root = static_cast<int>(std::find(job.members->begin(), job.members->end(), resp.root) - job.members->begin());
      const BlockPart p = part(static_cast<size_t>(resp.counts[0]));
      send_parts[0] = p;
      if (me == root) {
        input = in + p.begin * esize;
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
      input = in + recv_parts[me].begin * esize;
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
  // The parts of the caller's input this share sends (alltoall, reducescatter), in rank order.
  auto caller_part = [&](int i) { return in + (send_offsets[i] + send_parts[i].begin) * esize; };
  auto pack = [&](uint8_t* to) {
    for (int i = 0; i < n; ++i) {
      std::memcpy(to, caller_part(i), send_parts[i].count * esize);
      to += send_parts[i].count * esize;
    }
  };
  const bool packs = resp.type == OpType::kAlltoall || resp.type == OpType::kReducescatter;
  record_started(rec, input, input_bytes, packs ? std::function<void(uint8_t*)>(pack) : nullptr);
  if (rec.original.data() && input_bytes > 0) input = rec.original.data();  // the kept copy
  // Consecutive parts of `sizes` bytes starting at `base` (a packed buffer's blocks).
  auto consecutive = [&](uint8_t* base, const std::vector<size_t>& sizes) {
    std::vector<uint8_t*> at(n);
    for (int i = 0; i < n; ++i) {
      at[i] = base;
      base += sizes[i];
    }
    return at;
  };
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  for (int i = 0; i < n; ++i) {
    send_bytes[i] = send_parts[i].count * esize;
    recv_bytes[i] = recv_parts[i].count * esize;
  }
  // Where the parts this share sends are read: the kept copy (packed) or the caller's input.
  std::vector<const uint8_t*> send_at(n);
  if (packs) {
    const std::vector<uint8_t*> kept =
        rec.original.data() ? consecutive(rec.original.data(), send_bytes) : std::vector<uint8_t*>();
    for (int i = 0; i < n; ++i) send_at[i] = kept.empty() ? caller_part(i) : kept[i];
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

  // The rail is watched while it communicates, not while this rank then scales what it received:
  // a step that moves no byte and, on 2 busy cores, can outlast the 100 ms the watchdog allows a
  // silent rail.
  bool watched = watchdog_ != nullptr;
  auto communicated = [&] {
    if (watched) watchdog_->end(r, true);
    watched = false;
  };
  if (watched) watchdog_->begin(r, what);
  try {
    switch (resp.type) {
      case OpType::kBroadcast: {
        const size_t bytes = send_parts[0].count * esize;
        uint8_t* target = static_cast<uint8_t*>(e.output) + send_parts[0].begin * esize;
        if (rec.into_scratch) {
          scratch = pool_.acquire(bytes);
          target = scratch.data();
        }
        if (me == root && target != input) std::memcpy(target, input, bytes);
        collectives::broadcast(*rail, target, bytes, root, copt);
        break;
      }
      case OpType::kAllgather:
        collectives::allgatherv_blocks(*rail, input, received_at(), recv_bytes, copt);
        break;
      case OpType::kAlltoall: {
        collectives::alltoallv_blocks(*rail, send_at, send_bytes, received_at(), recv_bytes, copt);
        break;
      }
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
        collectives::reducescatterv_blocks(*rail, send_at, work_at, counts, resp.dtype, resp.op, copt);
        communicated();
        const double post = effective_postscale(resp, n);
        if (post != 1.0) collectives::scale(mine, counts[me], resp.dtype, post);
        break;
      }
      default:
        break;
    }
    communicated();
    record_done(rec);
    if (!rec.into_scratch) striped_part_done(job, "");
  } catch (const std::exception& ex) {
    if (watched) watchdog_->end(r, false);
    std::string msg = what + " failed on rail '" + rails_[r]->properties().name + "': " + ex.what();
    if (record_lost(rec, msg)) return;
    if (rec.into_scratch) return;
    std::string fatal = fatal_error(resp);  // the cause, rather than the rail's abort
    striped_part_done(job, fatal.empty() ? msg : fatal);
  }
}

}  // namespace nezha::engine
