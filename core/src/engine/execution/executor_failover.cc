// Executor: the failover half (see executor.h): probes, progress, and redo of a failed rail's tasks
// on a surviving rail, through the ledger (task_ledger.h); the tasks themselves (share_task.h) keep
// their inputs and make their redos.
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
  const TaskLedger::Moved moved = ctx_->ledger.move(
      rail, first,
      [&](ShareTask& old, ShareTask::Pass pass) {
        std::shared_ptr<ShareTask> task = old.redo_on(target, pass, *ctx_);
        if (task) task->seq = seq_[target]++;
        return task;
      },
      [&](std::shared_ptr<ShareTask> task) { post_entered(std::move(task), false); });
  NZ_LOG(Debug) << "rank " << opt_.rank << ": redoing " << moved.redone << " of " << moved.taken << " share(s) ("
                << moved.bytes << " bytes) of rail " << rail << " from seq " << first << " on rail " << target;
}

void Executor::trim(const std::vector<uint64_t>& watermark) { ctx_->ledger.trim(watermark); }

void Executor::fail_all(const std::string& reason) {
  // Queued and running tasks complete their operations from their workers (they see fatal()),
  // when no rail touches the buffers any more. A lost task waits for a redo that will not come
  // now, and nothing touches it: fail it here.
  for (auto& task : ctx_->ledger.fail_all(reason)) task->abandon(*ctx_);
}

}  // namespace nezha::engine
