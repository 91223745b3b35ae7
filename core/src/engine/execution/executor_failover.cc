// Executor: the failover half (see executor.h): redo of a failed rail's tasks on a surviving rail,
// trimming the ledger once every rank has completed a task, and failing what is left when the job
// cannot go on. The tasks themselves (share_task.h) keep their inputs and make their redos.
#include <algorithm>

#include "common/logging.h"
#include "engine/execution/executor.h"
#include "engine/execution/share_task.h"
#include "engine/execution/task_context.h"

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

std::vector<uint64_t> Executor::completed() const {
  std::vector<uint64_t> out(ctx_->rails.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = ctx_->completed[i];
  return out;
}

uint64_t Executor::running(int rail) const { return ctx_->running[rail]; }

void Executor::redo(int rail, uint64_t first, int target) {
  if (ctx_->fatal()) return;
  std::vector<std::shared_ptr<ShareTask>> moved;
  {
    std::lock_guard<std::mutex> lock(ctx_->ledger_mu);
    auto& q = ctx_->ledger[rail];
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->seq >= first) {
        moved.push_back(*it);
        it = q.erase(it);
      } else {
        ++it;
      }
    }
    ctx_->update_lost(rail);
  }
  size_t redo_bytes = 0, redone = 0;
  for (auto& old : moved) {
    std::shared_ptr<ShareTask> task;
    {
      std::lock_guard<std::mutex> lock(ctx_->ledger_mu);
      if (old->state == ShareTask::State::kQueued || old->state == ShareTask::State::kRunning)
        NZ_LOG(Error) << "rank " << opt_.rank << ": redo of a share still "
                      << (old->state == ShareTask::State::kQueued ? "queued" : "running") << " on rail " << rail
                      << " (the rail was not drained)";
      // A rank that had completed the task runs it again for the others, into scratch. A task this
      // rank redoes so (its operation ended here long ago) is redone again, not dropped: dropping
      // it here only would shift this rail's operation numbers against every other rank's (a
      // 16-rank alltoall died so, "frame ... has length 523892 where 1048576 was expected", after
      // a rail failed while another's redo was queued).
      const auto pass = old->for_others() || old->state == ShareTask::State::kDone ? ShareTask::Pass::kRedoForOthers
                                                                                     : ShareTask::Pass::kRedo;
      task = old->redo_on(target, pass, *ctx_);
      if (!task) continue;  // its operation ended here without it: nothing to redo
      task->seq = seq_[target]++;
      ctx_->ledger[target].push_back(task);
    }
    redo_bytes += task->redo_bytes();
    ++redone;
    post_entered(std::move(task), false);
  }
  NZ_LOG(Debug) << "rank " << opt_.rank << ": redoing " << redone << " share(s) ("
                << redo_bytes << " bytes) of rail " << rail << " from seq " << first << " on rail " << target;
}

void Executor::trim(const std::vector<uint64_t>& watermark) {
  std::vector<std::shared_ptr<ShareTask>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(ctx_->ledger_mu);
  for (size_t r = 0; r < ctx_->ledger.size() && r < watermark.size(); ++r) {
    auto& q = ctx_->ledger[r];
    while (!q.empty() && q.front()->seq < watermark[r] && q.front()->state == ShareTask::State::kDone) {
      dropped.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
}

void Executor::fail_all(const std::string& reason) {
  std::vector<std::shared_ptr<ShareTask>> lost;
  {
    std::lock_guard<std::mutex> lock(ctx_->ledger_mu);
    ctx_->set_fatal(reason);
    for (auto& q : ctx_->ledger) {
      for (auto& task : q)
        if (task->state == ShareTask::State::kLost && !task->for_others()) lost.push_back(task);
      q.clear();
    }
  }
  // Queued and running tasks complete their operations from their workers (they see fatal()),
  // when no rail touches the buffers any more. A lost task waits for a redo that will not come
  // now, and nothing touches it: fail it here.
  for (auto& task : lost) task->abandon(*ctx_);
}

}  // namespace nezha::engine
