// Executor: the failover half (see executor.h): ledgers of shares with their input copies, redo
// on a surviving rail, and trimming once every rank has completed a share.
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"

namespace nezha::engine {
namespace {
constexpr double kProbeTimeoutS = 2.0;  // the test allreduce of a rail being re-admitted
}  // namespace

void Executor::post_task(int rail, std::function<void()> task) { workers_[rail]->post(std::move(task)); }

void Executor::post_probe(int rail, size_t bytes, std::function<void()> prepare,
                          std::function<void(const std::string&)> done) {
  const uint64_t seq = seq_[rail]++;
  workers_[rail]->post([this, rail, bytes, seq, prepare = std::move(prepare), done = std::move(done)] {
    try {
      if (prepare) prepare();
      // A rail that is up but still crawling (throttled) must fail its probe quickly, too.
      timed_test_allreduce(rail, bytes, seq, std::min(opt_.timeout_s, kProbeTimeoutS), "probe");
      done("");
    } catch (const std::exception& e) {
      done(e.what());
    }
  });
}

void Executor::record_started(ShareRecord& rec, const void* input, size_t bytes,
                              const std::function<void(uint8_t*)>& pack) {
  running_[rec.share.rail] = rec.seq + 1;
  if (!opt_.failover) return;
  {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    rec.state = ShareRecord::State::kRunning;
    if (rec.original.data() || bytes == 0) return;
    // First run: keep the input in case the rail fails mid-way.
    rec.original = originals_.acquire(bytes);
    rec.original_bytes = bytes;
    // An allreduce share's input is saved into it range by range while it runs (save_before_overwrite).
    if (!rec.single) return;
  }
  // Outside the lock: the other rails' shares start and end meanwhile (a running record's copy is
  // touched by no other thread; a redo takes it only once the record is lost).
  if (pack) pack(rec.original.data());
  else std::memcpy(rec.original.data(), input, bytes);
}

void Executor::save_before_overwrite(ShareRecord& rec, const uint8_t* input, size_t offset, size_t bytes) {
  uint8_t* copy = rec.original.data();
  rec.saved.save(offset, offset + bytes,
                 [&](size_t b, size_t e) { std::memcpy(copy + b, input + b, e - b); });
}

void Executor::restore_input(const ShareRecord& rec, uint8_t* target, const uint8_t* range, size_t bytes) {
  // Bytes never overwritten still hold the input in the job's input (`range`); copy those only when
  // rebuilding elsewhere (a scratch buffer, or the output of an out-of-place job).
  if (target != range)
    rec.saved.for_each_gap(bytes, [&](size_t b, size_t e) { std::memcpy(target + b, range + b, e - b); });
  const uint8_t* copy = rec.original.data();
  rec.saved.for_each([&](size_t b, size_t e) { std::memcpy(target + b, copy + b, e - b); });
}

void Executor::record_done(ShareRecord& rec) {
  completed_[rec.share.rail] = rec.seq + 1;
  running_[rec.share.rail] = 0;
  if (!opt_.failover) return;
  std::lock_guard<std::mutex> lock(ledger_mu_);
  rec.state = ShareRecord::State::kDone;
}

bool Executor::record_lost(ShareRecord& rec, const std::string& what) {
  running_[rec.share.rail] = 0;
  if (!opt_.failover || fatal_) return false;
  {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    rec.state = ShareRecord::State::kLost;
    lost_[rec.share.rail] = true;
  }
  hooks_.on_rail_error(rec.share.rail, what, /*stalled=*/false, rec.seq);
  return true;
}

std::vector<uint64_t> Executor::completed() const {
  std::vector<uint64_t> out(rails_.size());
  for (size_t i = 0; i < rails_.size(); ++i) out[i] = completed_[i];
  return out;
}

void Executor::redo(int rail, uint64_t first, int target) {
  if (fatal_) return;
  std::vector<std::shared_ptr<ShareRecord>> moved;
  {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    auto& q = ledger_[rail];
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->seq >= first) {
        moved.push_back(*it);
        it = q.erase(it);
      } else {
        ++it;
      }
    }
    lost_[rail] = std::any_of(q.begin(), q.end(),
                              [](const auto& rec) { return rec->state == ShareRecord::State::kLost; });
  }
  size_t redo_bytes = 0;
  for (auto& old : moved) {
    if (old->skipped) {  // another process set's: takes its number on the target rail, as there
      auto rec = std::make_shared<ShareRecord>();
      rec->skipped = true;
      rec->share = {target, 0, 0};
      {
        std::lock_guard<std::mutex> lock(ledger_mu_);
        rec->seq = seq_[target]++;
        ledger_[target].push_back(rec);
      }
      post_share(std::move(rec), false);
      continue;
    }
    // A one-rail or striped job that ended here without this share (failed for good) has nothing to
    // redo. A share this rank redoes into scratch for the others (its job ended here long ago) is
    // redone again: skipping it here only would shift this rail's operation numbers against every
    // other rank's (a 16-rank alltoall died so, "frame ... has length 523892 where 1048576 was
    // expected", after a rail failed while another's redo was queued).
    if (old->single && old->single->finished && old->state != ShareRecord::State::kDone && !old->into_scratch)
      continue;
    const size_t esize = old->job ? dtype_size(old->job->resp.dtype) : 1;
    // A striped part's input is packed from the caller's buffers when it first runs (never
    // overwritten: outputs are separate); it has a copy once it has started.
    // A balanced share's input is saved in its job's buffer (job->original), range by range.
    const bool balanced = old->job && old->job->balancer;
    const size_t bytes = balanced       ? 0
                         : old->job     ? old->share.count * esize
                         : old->striped ? 0
                                        : single_input_bytes(*old->single);
    auto rec = std::make_shared<ShareRecord>();
    rec->job = old->job;
    rec->single = old->single;
    rec->striped = old->striped;
    rec->share = old->share;
    rec->share.rail = target;
    rec->part = old->part;
    rec->is_redo = true;
    {
      std::lock_guard<std::mutex> lock(ledger_mu_);
      if (old->state == ShareRecord::State::kQueued || old->state == ShareRecord::State::kRunning)
        NZ_LOG(Error) << "rank " << opt_.rank << ": redo of a share still "
                      << (old->state == ShareRecord::State::kQueued ? "queued" : "running")
                      << " on rail " << rail << " (the rail was not drained)";
      rec->into_scratch = old->into_scratch || old->state == ShareRecord::State::kDone;
      if (old->original.data() || balanced) {
        rec->original = std::move(old->original);
        rec->saved = std::move(old->saved);
      } else if (bytes > 0) {
        // Never started here: the input is still intact (an allreduce share's in the job's buffer,
        // where the redo saves it range by range).
        rec->original = originals_.acquire(bytes);
        if (!old->job) std::memcpy(rec->original.data(), old->single->entry.input, bytes);
      }
      rec->original_bytes = old->striped ? old->original_bytes : bytes;
      rec->seq = seq_[target]++;
      ledger_[target].push_back(rec);
    }
    redo_bytes += bytes;
    post_share(std::move(rec), false);
  }
  NZ_LOG(Debug) << "rank " << opt_.rank << ": redoing " << moved.size() << " share(s) ("
                << redo_bytes << " bytes) of rail " << rail << " from seq " << first << " on rail "
                << target;
}

void Executor::trim(const std::vector<uint64_t>& watermark) {
  std::vector<std::shared_ptr<ShareRecord>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(ledger_mu_);
  for (size_t r = 0; r < ledger_.size() && r < watermark.size(); ++r) {
    auto& q = ledger_[r];
    while (!q.empty() && q.front()->seq < watermark[r] &&
           q.front()->state == ShareRecord::State::kDone) {
      dropped.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
}

void Executor::fail_all(const std::string& reason) {
  std::vector<std::shared_ptr<ShareRecord>> lost;
  {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    if (!fatal_) fatal_reason_ = reason;
    fatal_ = true;
    for (auto& q : ledger_) {
      for (auto& rec : q)
        if (rec->state == ShareRecord::State::kLost && !rec->into_scratch) lost.push_back(rec);
      q.clear();
    }
  }
  // Queued and running shares complete their operations from their workers (run_share and
  // run_single_record see fatal_), when no rail touches the buffers any more. A lost share waits
  // for a redo that will not come now, and nothing touches it: fail it here.
  for (auto& rec : lost) {
    if (rec->striped) {
      striped_part_done(*rec->single, fatal_error(rec->single->resp));
    } else if (rec->single) {
      SingleJob& job = *rec->single;
      if (!job.finished.exchange(true)) complete_single(job, fatal_error(job.resp));
    } else {
      fail_part(*rec->job, fatal_error(rec->job->resp));
    }
  }
}

}  // namespace nezha::engine
