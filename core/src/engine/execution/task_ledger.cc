#include "engine/execution/task_ledger.h"

#include <algorithm>

#include "common/logging.h"

namespace nezha::engine {

TaskLedger::TaskLedger(size_t rails, int rank)
    : rank_(rank), ledger_(rails), lost_(new std::atomic<bool>[rails]) {
  for (size_t i = 0; i < rails; ++i) lost_[i] = false;
}

void TaskLedger::enter(std::shared_ptr<ShareTask> task) {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_[task->rail()].push_back(std::move(task));
}

void TaskLedger::set_state(ShareTask& task, ShareTask::State state) {
  std::lock_guard<std::mutex> lock(mu_);
  task.state = state;
}

bool TaskLedger::mark_lost(ShareTask& task) {
  if (failed_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  task.state = ShareTask::State::kLost;
  lost_[task.rail()] = true;
  return true;
}

TaskLedger::Moved TaskLedger::move(int rail, uint64_t first, const Redo& redo,
                                   const std::function<void(std::shared_ptr<ShareTask>)>& post) {
  std::vector<std::shared_ptr<ShareTask>> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& q = ledger_[rail];
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->seq >= first) {
        taken.push_back(*it);
        it = q.erase(it);
      } else {
        ++it;
      }
    }
    lost_[rail] = std::any_of(q.begin(), q.end(), [](const auto& t) { return t->state == ShareTask::State::kLost; });
  }
  Moved moved;
  moved.taken = taken.size();
  for (auto& old : taken) {
    std::shared_ptr<ShareTask> task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (old->state == ShareTask::State::kQueued || old->state == ShareTask::State::kRunning)
        NZ_LOG(Error) << "rank " << rank_ << ": redo of a share still "
                      << (old->state == ShareTask::State::kQueued ? "queued" : "running") << " on rail " << rail
                      << " (the rail was not drained)";
      // A task this rank redoes for the others (its operation ended here long ago) is redone again,
      // not dropped: dropping it here only would shift this rail's operation numbers against every
      // other rank's (a 16-rank alltoall died so, "frame ... has length 523892 where 1048576 was
      // expected", after a rail failed while another's redo was queued).
      const bool completed_here = old->for_others() || old->state == ShareTask::State::kDone;
      task = redo(*old, completed_here ? ShareTask::Pass::kRedoForOthers : ShareTask::Pass::kRedo);
      if (!task) continue;
      ledger_[task->rail()].push_back(task);
    }
    ++moved.redone;
    moved.bytes += task->redo_bytes();
    post(std::move(task));
  }
  return moved;
}

void TaskLedger::trim(const std::vector<uint64_t>& watermark) {
  std::vector<std::shared_ptr<ShareTask>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < ledger_.size() && r < watermark.size(); ++r) {
    auto& q = ledger_[r];
    while (!q.empty() && q.front()->seq < watermark[r] && q.front()->state == ShareTask::State::kDone) {
      dropped.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
}

std::vector<std::shared_ptr<ShareTask>> TaskLedger::fail_all(const std::string& reason) {
  std::vector<std::shared_ptr<ShareTask>> lost;
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) reason_ = reason;
  failed_ = true;
  for (auto& q : ledger_) {
    for (auto& task : q)
      if (task->state == ShareTask::State::kLost && !task->for_others()) lost.push_back(task);
    q.clear();
  }
  return lost;
}

std::string TaskLedger::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

size_t TaskLedger::size(int rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_[rail].size();
}

}  // namespace nezha::engine
