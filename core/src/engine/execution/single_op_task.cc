// SingleOp (task_kinds.h): a broadcast, allgather, alltoall or reducescatter run whole on one rail
// (a point-to-point rail through the collective algorithms, or a collective rail that runs it).
// With failover it is kept in the rail's ledger like an allreduce share, with a copy of its input,
// so a rail failure redoes it on another rail.
#include <cstring>
#include <type_traits>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {

// Runs the collective of `resp` on `rail` (the operation's rail, or its process set's view of it:
// rank() and size() in the set; `members` the set's job ranks, null for every rank). A collective
// rail (the plan gives one only operations of every rank that it runs) runs the whole operation
// itself.
template <class RailT>
void run_collective(TaskContext& ctx, const Response& resp, const TensorEntry& e, RailT& rail,
                    const std::vector<int>* members, uint64_t seq, const void* input, void* output, OpResult& res) {
  constexpr bool kPointToPoint = std::is_base_of_v<transport::PointToPointRail, RailT>;
  collectives::CollectiveOptions copt = ctx.collective_options(seq, ctx.opt.timeout_s);
  const size_t esize = dtype_size(resp.dtype);
  // Ranks of the rail (a process set's view: of the set); the root is named by its job rank.
  const int me = rail.rank(), n = rail.size();
  const std::vector<int64_t>& shape = e.req.shape;
  switch (resp.type) {
    case OpType::kBroadcast: {
      size_t bytes = static_cast<size_t>(resp.counts[0]) * esize;
      const int root = place_among(members, resp.root, n).first;
      if (me == root && output != input) std::memcpy(output, input, bytes);
      collectives::broadcast(rail, output, bytes, root, copt);
      break;
    }
    case OpType::kAllgather: {
      size_t row_bytes = static_cast<size_t>(resp.row_elements[0]) * esize;
      std::vector<size_t> bytes(n);
      int64_t rows = 0;
      for (int i = 0; i < n; ++i) {
        bytes[i] = static_cast<size_t>(resp.rank_rows[i]) * row_bytes;
        rows += resp.rank_rows[i];
      }
      res.output.resize(static_cast<size_t>(rows) * row_bytes);
      collectives::allgatherv(rail, input, res.output.data(), bytes, copt);
      res.output_shape = with_rows(shape, rows);
      break;
    }
    case OpType::kAlltoall: {
      size_t row_bytes = static_cast<size_t>(resp.row_elements[0]) * esize;
      std::vector<size_t> send(n), recv(n);
      int64_t rows = 0;
      res.received_splits.assign(n, 0);
      for (int i = 0; i < n; ++i) {
        send[i] = static_cast<size_t>(resp.splits_matrix[me * n + i]) * row_bytes;
        res.received_splits[i] = resp.splits_matrix[i * n + me];
        recv[i] = static_cast<size_t>(res.received_splits[i]) * row_bytes;
        rows += res.received_splits[i];
      }
      res.output.resize(static_cast<size_t>(rows) * row_bytes);
      if constexpr (kPointToPoint) {
        collectives::alltoallv(rail, input, send, res.output.data(), recv, copt);
      } else {  // an alltoall of every rank: the whole matrix
        std::vector<size_t> matrix(static_cast<size_t>(n) * n);
        for (size_t c = 0; c < matrix.size(); ++c) matrix[c] = static_cast<size_t>(resp.splits_matrix[c]) * row_bytes;
        collectives::alltoallv(rail, input, res.output.data(), matrix, copt);
      }
      res.output_shape = with_rows(shape, rows);
      break;
    }
    case OpType::kReducescatter: {
      size_t total = static_cast<size_t>(resp.counts[0]);
      size_t row = static_cast<size_t>(resp.row_elements[0]);
      std::vector<size_t> counts(n);
      for (int i = 0; i < n; ++i) counts[i] = static_cast<size_t>(resp.rank_rows[i]) * row;
      // Partial sums go to scratch, this rank's block straight to the output; the input is read
      // where it is (copied first only to prescale it).
      BufferPool::Buffer scratch = ctx.pool.acquire(total * esize);
      res.output.resize(counts[me] * esize);
      std::vector<const uint8_t*> in_at(n);
      std::vector<uint8_t*> work_at(n);
      const auto* src = static_cast<const uint8_t*>(input);
      if (resp.prescale != 1.0) {
        std::memcpy(scratch.data(), input, total * esize);
        collectives::scale(scratch.data(), total, resp.dtype, resp.prescale);
        src = scratch.data();
      }
      size_t at = 0;
      for (int i = 0; i < n; ++i) {
        in_at[i] = src + at * esize;
        work_at[i] = scratch.data() + at * esize;
        at += counts[i];
      }
      work_at[me] = res.output.data();
      collectives::reducescatterv_blocks(rail, in_at, work_at, counts, resp.dtype, resp.op, copt);
      double post = effective_postscale(resp, n);
      if (post != 1.0) collectives::scale(res.output.data(), counts[me], resp.dtype, post);
      res.output_shape = with_rows(shape, resp.rank_rows[me]);
      break;
    }
    default:
      throw NezhaError(std::string("unexpected operation ") + op_type_name(resp.type));
  }
}

}  // namespace

size_t SingleJob::input_bytes() const {
  const size_t esize = dtype_size(resp.dtype);
  if (resp.type == OpType::kBroadcast || resp.type == OpType::kReducescatter)
    return static_cast<size_t>(resp.counts[0]) * esize;
  return static_cast<size_t>(entry.req.num_elements()) * esize;  // allgather, alltoall: this rank's
}

void SingleOp::run(TaskContext& ctx) {
  SingleJob& job = *job_;
  TensorEntry& e = job.entry;
  const Response& resp = job.resp;
  const int r = rail();
  if (job.finished && !for_others()) return;
  if (ctx.fatal()) {  // fail_all: the job cannot go on; skipped
    if (!for_others() && !job.finished.exchange(true)) job.complete(ctx.fatal_error(resp));
    return;
  }
  const size_t in_bytes = job.input_bytes();
  ctx.started(*this);
  if (ctx.opt.failover && !original_.data() && in_bytes > 0) {  // first run: keep the input
    original_ = ctx.originals.acquire(in_bytes);
    std::memcpy(original_.data(), e.input, in_bytes);
    ctx.kept_bytes += in_bytes;
  }
  const void* input = is_redo() && in_bytes > 0 ? original_.data() : e.input;
  // A rank that had completed the operation takes part in its redo without touching what it
  // delivered: results go to scratch.
  OpResult scratch_result;
  BufferPool::Buffer scratch_out;
  OpResult& res = for_others() ? scratch_result : e.handle->result();
  void* output = e.output;
  if (for_others() && resp.type == OpType::kBroadcast) {
    scratch_out = ctx.pool.acquire(in_bytes);
    output = scratch_out.data();
  }
  // Watched for silence like an allreduce share: a cut under it stalls every rank, and the allreduces
  // queued behind it on this rail never start, so nothing else would notice (a broadcast's pieces
  // are sized so that no rank waits long in silence for its turn: broadcast.cc).
  const std::string what = std::string(op_type_name(resp.type)) + " of " + names_str(resp);
  if (ctx.watchdog) ctx.watchdog->begin(r, what);
  try {
    transport::CollectiveRail* coll = ctx.rails[r]->as_collective();
    if (coll && !job.members) {
      run_collective(ctx, resp, e, *coll, nullptr, seq, input, output, res);
    } else if (job.members) {
      transport::GroupRail set_view(ctx.point_to_point(r, op_type_name(resp.type)), *job.members);
      run_collective(ctx, resp, e, set_view, job.members.get(), seq, input, output, res);
    } else {
      run_collective(ctx, resp, e, ctx.point_to_point(r, op_type_name(resp.type)), nullptr, seq, input, output, res);
    }
    if (ctx.watchdog) ctx.watchdog->end(r, true);
    ctx.done(*this);
    if (!for_others() && !job.finished.exchange(true)) job.complete("");
  } catch (const std::exception& ex) {
    if (ctx.watchdog) ctx.watchdog->end(r, false);
    std::string msg = what + " failed on rail '" + ctx.rails[r]->properties().name + "': " + ex.what();
    if (ctx.lost(*this, msg)) return;
    std::string fatal = ctx.fatal_error(resp);  // the cause, rather than the rail's abort
    if (fatal.empty()) NZ_LOG(Error) << msg;
    if (!for_others() && !job.finished.exchange(true)) job.complete(fatal.empty() ? msg : fatal);
  }
}

std::unique_ptr<ShareTask> SingleOp::redo_on(int target, Pass pass, TaskContext& ctx) {
  // An operation that ended here without this task (failed for good) has nothing to redo.
  if (pass == Pass::kRedo && job_->finished) return nullptr;
  auto redo = std::make_unique<SingleOp>(job_, target, pass);
  const size_t bytes = job_->input_bytes();
  if (original_.data()) {
    redo->original_ = std::move(original_);
  } else if (bytes > 0) {  // never started here: the caller's input is still intact
    redo->original_ = ctx.originals.acquire(bytes);
    std::memcpy(redo->original_.data(), job_->entry.input, bytes);
    ctx.kept_bytes += bytes;
  }
  return redo;
}

void SingleOp::abandon(TaskContext& ctx) {
  if (!job_->finished.exchange(true)) job_->complete(ctx.fatal_error(job_->resp));
}

size_t SingleOp::redo_bytes() const { return job_->input_bytes(); }

}  // namespace nezha::engine
