// SkippedOp (task_kinds.h): another process set's operation, which this rank only numbers.
#include "engine/execution/task_context.h"
#include "engine/execution/task_kinds.h"

namespace nezha::engine {

void SkippedOp::run(TaskContext& ctx) {
  if (ctx.ledger.has_lost(rail())) {
    // Behind a share lost on this rail: lost as well (it moves with the redo), never done, or
    // completed() would pass the lost share and the redo agreed from it would leave it out (a set's
    // allreduce cut there never finished: ProcessSetEngineFailover).
    ctx.ledger.set_state(*this, State::kLost);
    return;
  }
  ctx.started(*this);
  ctx.done(*this);
}

std::unique_ptr<ShareTask> SkippedOp::redo_on(int target, Pass, TaskContext&) {
  return std::make_unique<SkippedOp>(target);  // takes its number on the target rail, as here
}

}  // namespace nezha::engine
