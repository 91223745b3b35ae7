// Executor: the shares of a balanced allreduce (share_balancer.h says why, and how ranks agree).
//
// Each part (share of the plan) runs on its rail's worker, on every rank, range by range as the
// leader hands them out (balanced_ranges.h; defined here, used by executor_striped.cc as well).
// A redo (the part's rail failed) runs exactly the ranges the leader had handed the part, in order,
// on the redo's rail; the pool itself is left to the rails still running (what nobody started is
// taken by them, with no redo).
#include <chrono>
#include <cstring>
#include <optional>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "common/error.h"
#include "engine/execution/balanced_ranges.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/failover/rail_watchdog.h"
#include "transport/collective_rail.h"
#include "transport/group_rail.h"

namespace nezha::engine {
namespace {

// Claim messages are numbered from this step up, far above any collective's step within one
// operation, so a rank that took one for data (or the reverse) fails on the tag, never misreads.
constexpr uint64_t kClaimStep = uint64_t{1} << 19;
// A redo's list of ranges: more than this is not a list any leader sent.
constexpr uint64_t kMaxRedoRanges = uint64_t{1} << 16;

struct WireRange {
  uint64_t offset, count;
};

void send_to_others(transport::Rail& rail, uint64_t tag, const void* data, size_t bytes, const Deadline& d) {
  for (int p = 0; p < rail.size(); ++p)
    if (p != rail.rank()) rail.send(p, tag, data, bytes, d);
}

ShareBalancer::Range checked(const WireRange& w, size_t total, const transport::Rail& rail) {
  if (w.offset > total || w.count > total - w.offset)
    throw ProtocolError("rail '" + rail.properties().name + "': the balancing leader sent range [" + std::to_string(w.offset) +
                        ", +" + std::to_string(w.count) + ") of an operation of " + std::to_string(total) +
                        " elements");
  return {static_cast<size_t>(w.offset), static_cast<size_t>(w.count)};
}

// The next range of `part`: taken from the pool by the leader and sent to the others, received by them.
ShareBalancer::Range next_range(transport::Rail& rail, int leader, ShareBalancer& balancer, size_t part,
                                uint64_t tag, size_t total, const Deadline& d) {
  WireRange w{};
  if (rail.rank() == leader) {
    const ShareBalancer::Range r = balancer.claim(part);
    w = {r.offset, r.count};
    send_to_others(rail, tag, &w, sizeof w, d);
  } else {
    rail.recv(leader, tag, &w, sizeof w, d);
  }
  return checked(w, total, rail);
}

// The ranges the leader handed `part` (its record), as the leader has them.
std::vector<ShareBalancer::Range> redo_ranges(transport::Rail& rail, int leader, const ShareBalancer& balancer,
                                              size_t part, uint64_t tag, size_t total, const Deadline& d) {
  std::vector<WireRange> wire;
  uint64_t n = 0;
  if (rail.rank() == leader) {
    for (const auto& r : balancer.claimed(part)) wire.push_back({r.offset, r.count});
    n = wire.size();
    send_to_others(rail, tag, &n, sizeof n, d);
    if (n) send_to_others(rail, tag + 1, wire.data(), n * sizeof(WireRange), d);
  } else {
    rail.recv(leader, tag, &n, sizeof n, d);
    if (n > kMaxRedoRanges)
      throw ProtocolError("rail '" + rail.properties().name + "': rank " + std::to_string(leader) + " announced " +
                          std::to_string(n) + " ranges to redo");
    wire.resize(n);
    if (n) rail.recv(leader, tag + 1, wire.data(), n * sizeof(WireRange), d);
  }
  std::vector<ShareBalancer::Range> ranges;
  for (const auto& w : wire) ranges.push_back(checked(w, total, rail));
  return ranges;
}

}  // namespace

void for_each_balanced_range(transport::Rail& rail, int leader, ShareBalancer& balancer, size_t part, uint64_t seq,
                             bool is_redo, size_t total, double timeout_s,
                             const std::function<void(const ShareBalancer::Range&)>& run,
                             const std::function<void(bool)>& waiting) {
  // Only a rank other than the leader waits for a claim.
  auto wait = [&](bool on) {
    if (waiting && rail.rank() != leader) waiting(on);
  };
  if (is_redo) {
    for (const auto& range : redo_ranges(rail, leader, balancer, part, collectives::make_tag(seq, kClaimStep), total,
                                         Deadline::after_seconds(timeout_s)))
      run(range);
    return;
  }
  for (size_t k = 0;; ++k) {
    wait(true);
    const ShareBalancer::Range range = next_range(rail, leader, balancer, part, collectives::make_tag(seq, kClaimStep + k),
                                                  total, Deadline::after_seconds(timeout_s));
    wait(false);
    if (range.count == 0) return;
    run(range);
  }
}

bool Executor::balances(const std::vector<multirail::RailShare>& plan, size_t bytes, int size,
                        size_t min_range_bytes) const {
  if (opt_.balance_bytes == 0 || plan.size() < 2 || size < 2 || bytes < kBalanceMinRanges * min_range_bytes)
    return false;
  for (const auto& share : plan) {
    transport::Rail* rail = rails_[share.rail];
    // An aggregation rail reduces its share in the network and carries no claims: the plan's split
    // (its own cost model) stands.
    if (!rail->properties().point_to_point || rail->collective()) return false;
  }
  return true;
}

void Executor::run_balanced_share(ShareRecord& rec) {
  AllreduceJob& job = *rec.job;
  const int r = rec.share.rail;
  transport::Rail* rail = rails_[r];
  std::optional<transport::GroupRail> set_view;  // a process set's operation: among its members
  if (job.members) rail = &set_view.emplace(*rail, *job.members);
  if (!share_may_run(rec)) return;
  record_started(rec, nullptr, 0);  // the input is saved range by range, in job.original
  size_t total = 0;
  for (int64_t c : job.resp.counts) total += static_cast<size_t>(c);
  if (watchdog_) watchdog_->begin(r, "allreduce of " + names_str(job.resp));
  try {
    for_each_balanced_range(*rail, /*leader=*/0, *job.balancer, rec.part, rec.seq, rec.is_redo, total, opt_.timeout_s,
                            [&](const ShareBalancer::Range& range) { run_balanced_range(rec, *rail, range); });
    if (watchdog_) watchdog_->end(r, true);
    record_done(rec);
    if (!rec.into_scratch) part_done(job);
  } catch (const std::exception& e) {
    share_failed(rec, rail->properties().name, e.what());
  }
}

void Executor::run_balanced_range(ShareRecord& rec, transport::Rail& rail, const ShareBalancer::Range& range) {
  AllreduceJob& job = *rec.job;
  const int r = rec.share.rail;
  const size_t esize = dtype_size(job.resp.dtype);
  const size_t begin = range.offset * esize, bytes = range.count * esize;
  uint8_t* target = job.data + begin;
  const uint8_t* source = job.input + begin;  // the range's input (target itself in place)
  BufferPool::Buffer scratch;
  if (rec.into_scratch) {  // this rank has the result already: run for the others, keep nothing
    scratch = pool_.acquire(bytes);
    target = scratch.data();
  }
  if (rec.is_redo) {
    // The input, rebuilt in target (run in place there): bytes never overwritten are still in the
    // job's input, the others were saved.
    if (target != source)
      rec.saved.for_each_gap(begin, begin + bytes,
                             [&](size_t b, size_t e) { std::memcpy(target + (b - begin), source + (b - begin), e - b); });
    const uint8_t* copy = job.original.data();
    rec.saved.for_each([&](size_t b, size_t e) {
      b = std::max(b, begin);
      e = std::min(e, begin + bytes);
      if (b < e) std::memcpy(target + (b - begin), copy + b, e - b);
    });
  }
  const uint8_t* in = rec.is_redo ? target : source;
  collectives::CollectiveOptions copt = options(rec.seq, opt_.timeout_s);
  copt.postscale = effective_postscale(job.resp, job.size);
  if (job.original.data()) {
    copt.before_overwrite = [&rec, in, begin](size_t offset, size_t n) {
      uint8_t* copy = rec.job->original.data();
      rec.saved.save(begin + offset, begin + offset + n,
                     [&](size_t b, size_t e) { std::memcpy(copy + b, in + (b - begin), e - b); });
    };
  }
  auto start = std::chrono::steady_clock::now();
  if (job.members)  // among the set's members: flat, over the set's view of the rail
    collectives::allreduce(rail, in, target, range.count, job.resp.dtype, job.resp.op, copt);
  else
    allreduce_on(r, in, target, range.count, job.resp.dtype, job.resp.op, copt);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (table_) table_->observe(r, bytes, secs);
  if (observer_) observer_(r, bytes, start, secs, (rec.is_redo ? "redo: " : "") + names_str(job.resp));
}

}  // namespace nezha::engine
