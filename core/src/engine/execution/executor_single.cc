// Executor: collectives that run whole on one rail (broadcast, allgather, alltoall,
// reducescatter). With failover they are kept in the rail's ledger like allreduce shares, with a
// copy of their input, so a rail failure redoes them on another rail (executor_failover.cc).
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/group_rail.h"

namespace nezha::engine {

void Executor::run_on_one_rail(const Response& resp, std::vector<TensorEntry> entries,
                               std::shared_ptr<FusedTensors> fused) {
  if (resp.plan.size() > 1) {
    run_striped(resp, std::move(entries), std::move(fused));
    return;
  }
  auto rec = std::make_shared<ShareRecord>();
  rec->single = std::make_shared<SingleJob>();
  rec->single->resp = resp;
  rec->single->entry = std::move(entries.at(0));
  rec->single->fused = std::move(fused);
  rec->single->members = members_of(resp);
  rec->share.rail = resp.plan.empty() ? 0 : resp.plan[0].rail;
  rec->seq = seq_[rec->share.rail]++;
  if (opt_.failover) {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    ledger_[rec->share.rail].push_back(rec);
  }
  post_share(std::move(rec), false);
}

size_t Executor::single_input_bytes(const SingleJob& job) {
  const Response& r = job.resp;
  const size_t esize = dtype_size(r.dtype);
  if (r.type == OpType::kBroadcast || r.type == OpType::kReducescatter)
    return static_cast<size_t>(r.counts[0]) * esize;
  return static_cast<size_t>(job.entry.req.num_elements()) * esize;  // allgather, alltoall: this rank's
}

void Executor::run_single_record(ShareRecord& rec) {
  if (rec.striped) {
    run_striped_part(rec);
    return;
  }
  SingleJob& job = *rec.single;
  TensorEntry& e = job.entry;
  const Response& resp = job.resp;
  const int r = rec.share.rail;
  if (job.finished && !rec.into_scratch) return;
  if (fatal_) {  // fail_all: the job cannot go on; skipped
    if (!rec.into_scratch && !job.finished.exchange(true)) complete_single(job, fatal_error(resp));
    return;
  }
  const size_t in_bytes = single_input_bytes(job);
  record_started(rec, e.input, in_bytes);
  const void* input = rec.is_redo && in_bytes > 0 ? rec.original.data() : e.input;
  // A rank that had completed the operation takes part in its redo without touching what it
  // delivered: results go to scratch.
  OpResult scratch_result;
  BufferPool::Buffer scratch_out;
  OpResult& res = rec.into_scratch ? scratch_result : e.handle->result();
  void* output = e.output;
  if (rec.into_scratch && resp.type == OpType::kBroadcast) {
    scratch_out = pool_.acquire(in_bytes);
    output = scratch_out.data();
  }
  // Watched for silence like an allreduce share: a cut under it stalls every rank, and the allreduces
  // queued behind it on this rail never start, so nothing else would notice (a broadcast's pieces
  // are sized so that no rank waits long in silence for its turn: broadcast.cc).
  const std::string what = std::string(op_type_name(resp.type)) + " of " + names_str(resp);
  if (watchdog_) watchdog_->begin(r, what);
  try {
    if (job.members) {
      transport::GroupRail set_view(*rails_[r], *job.members);
      run_single(resp, e, set_view, job.members.get(), rec.seq, input, output, res);
    } else {
      run_single(resp, e, *rails_[r], nullptr, rec.seq, input, output, res);
    }
    if (watchdog_) watchdog_->end(r, true);
    record_done(rec);
    if (!rec.into_scratch && !job.finished.exchange(true)) complete_single(job, "");
  } catch (const std::exception& ex) {
    if (watchdog_) watchdog_->end(r, false);
    std::string msg = what +
                      " failed on rail '" + rails_[r]->properties().name + "': " + ex.what();
    if (record_lost(rec, msg)) return;
    std::string fatal = fatal_error(resp);  // the cause, rather than the rail's abort
    if (fatal.empty()) NZ_LOG(Error) << msg;
    if (!rec.into_scratch && !job.finished.exchange(true)) complete_single(job, fatal.empty() ? msg : fatal);
  }
}

void Executor::run_single(const Response& resp, const TensorEntry& e, transport::Rail& rail,
                          const std::vector<int>* members, uint64_t seq, const void* input,
                          void* output, OpResult& res) {
  collectives::CollectiveOptions copt = options(seq, opt_.timeout_s);
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
      collectives::alltoallv(rail, input, send, res.output.data(), recv, copt);
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
      BufferPool::Buffer scratch = pool_.acquire(total * esize);
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

}  // namespace nezha::engine
