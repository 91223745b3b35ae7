// Executor: broadcast, allgather, alltoall and reducescatter turned into tasks: one SingleOp on one
// rail, or one StripedPart per share of the plan (task_kinds.h, striped_part_task.cc).
#include <algorithm>

#include "collectives/collectives.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/striped_parts.h"
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"

namespace nezha::engine {

void Executor::run_on_one_rail(const Response& resp, std::vector<TensorEntry> entries,
                               std::shared_ptr<FusedTensors> fused) {
  if (resp.plan.size() > 1) {
    run_striped(resp, std::move(entries), std::move(fused));
    return;
  }
  auto job = std::make_shared<SingleJob>();
  job->resp = resp;
  job->entry = std::move(entries.at(0));
  job->fused = std::move(fused);
  job->members = members_of(resp);
  post(std::make_shared<SingleOp>(job, resp.plan.empty() ? 0 : resp.plan[0].rail), false, /*lone=*/true);
}

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
    const size_t min_claim = std::max<size_t>(1, leader_min_range_bytes(resp.plan, min_range_bytes) / esize);
    const size_t floor_claim = resp.type == OpType::kAlltoall ? min_claim : min_claim / kMinClaimSpread;
    job->balancer = std::make_unique<ShareBalancer>(resp.plan, min_claim, 1, floor_claim);
    const bool has_input = resp.type != OpType::kBroadcast || opt_.rank == resp.root;
    if (opt_.failover && has_input) job->original = ctx_->originals.acquire(job->input_bytes());
  }
  const size_t callers = largest_share(resp.plan);
  for (size_t part = 0; part < resp.plan.size(); ++part)
    post(std::make_shared<StripedPart>(job, resp.plan[part], part), false, part == callers);
}

}  // namespace nezha::engine
