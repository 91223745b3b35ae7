// Executor: the failover half (see executor.h): ledgers of shares with their input copies, redo
// on a surviving rail, and trimming once every rank has completed a share.
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/executor.h"
#include "engine/executor_jobs.h"

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
      const size_t count = bytes / sizeof(float);
      BufferPool::Buffer buf = pool_.acquire(count * sizeof(float));
      std::memset(buf.data(), 0, count * sizeof(float));
      collectives::CollectiveOptions copt;
      copt.seq = seq;
      copt.segment_bytes = opt_.segment_bytes;
      copt.logstep_max_bytes = opt_.logstep_max_bytes;
      // A rail that is up but still crawling (throttled) must fail its probe quickly, too.
      copt.deadline = Deadline::after_seconds(std::min(opt_.timeout_s, kProbeTimeoutS));
      auto start = std::chrono::steady_clock::now();
      collectives::allreduce(*rails_[rail], buf.data(), count, DataType::kFloat32, ReduceOp::kSum, copt);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      completed_[rail] = seq + 1;
      if (observer_) observer_(rail, count * sizeof(float), start, secs, "probe");
      done("");
    } catch (const std::exception& e) {
      done(e.what());
    }
  });
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
  }
  size_t redo_bytes = 0;
  for (auto& old : moved) {
    if (old->single && old->single->finished && old->state != ShareRecord::State::kDone) continue;
    const size_t esize = old->job ? dtype_size(old->job->resp.dtype) : 1;
    const size_t bytes = old->job ? old->share.count * esize : single_input_bytes(*old->single);
    auto rec = std::make_shared<ShareRecord>();
    rec->job = old->job;
    rec->single = old->single;
    rec->share = old->share;
    rec->share.rail = target;
    rec->is_redo = true;
    {
      std::lock_guard<std::mutex> lock(ledger_mu_);
      if (old->state == ShareRecord::State::kQueued || old->state == ShareRecord::State::kRunning)
        NZ_LOG(Error) << "rank " << opt_.rank << ": redo of a share still "
                      << (old->state == ShareRecord::State::kQueued ? "queued" : "running")
                      << " on rail " << rail << " (the rail was not drained)";
      rec->into_scratch = old->into_scratch || old->state == ShareRecord::State::kDone;
      if (old->original.data()) {
        rec->original = std::move(old->original);
      } else if (bytes > 0) {
        // Never started here: the input is still intact.
        rec->original = originals_.acquire(bytes);
        const void* from = old->job ? static_cast<const void*>(old->job->data + old->share.offset * esize)
                                    : old->single->entry.input;
        std::memcpy(rec->original.data(), from, bytes);
      }
      rec->original_bytes = bytes;
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
  fatal_ = true;
  std::vector<std::shared_ptr<ShareRecord>> records;
  {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    for (auto& q : ledger_) {
      records.insert(records.end(), q.begin(), q.end());
      q.clear();
    }
  }
  for (auto& rec : records) {
    if (rec->single) {
      SingleJob& job = *rec->single;
      if (!job.finished.exchange(true))
        job.entry.handle->complete(std::string(op_type_name(job.resp.type)) + " of '" +
                                   job.entry.req.name + "': " + reason);
      continue;
    }
    AllreduceJob& job = *rec->job;
    if (job.finished.exchange(true)) continue;
    for (auto& e : job.entries)
      if (e.handle) e.handle->complete("allreduce of '" + e.req.name + "': " + reason);
  }
}

size_t Executor::kept_bytes() const {
  std::lock_guard<std::mutex> lock(ledger_mu_);
  size_t total = 0;
  for (const auto& q : ledger_)
    for (const auto& rec : q) total += rec->original.data() ? rec->original_bytes : 0;
  return total;
}

}  // namespace nezha::engine
