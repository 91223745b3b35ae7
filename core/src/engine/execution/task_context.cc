#include "engine/execution/task_context.h"

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "engine/execution/call_timing_rail.h"
#include "engine/failover/rail_watchdog.h"
#include "multirail/share_timing.h"
#include "transport/collective_rail.h"
#include "transport/host_lane.h"

namespace nezha::engine {

std::string names_str(const Response& r) {
  std::string s;
  for (size_t i = 0; i < r.names.size() && i < 4; ++i) s += (i ? ", '" : "'") + r.names[i] + "'";
  if (r.names.size() > 4) s += " and " + std::to_string(r.names.size() - 4) + " more";
  return s;
}

TaskContext::TaskContext(ExecutorOptions opt_in, std::vector<transport::Rail*> rails_in,
                         multirail::RailTable* table_in, ShareObserver observer_in, ExecutorHooks hooks_in)
    : opt(opt_in),
      rails(std::move(rails_in)),
      table(table_in),
      observer(std::move(observer_in)),
      hooks(std::move(hooks_in)),
      ledger(rails.size(), opt.rank),
      completed(new std::atomic<uint64_t>[rails.size()]),
      running(new std::atomic<uint64_t>[rails.size()]) {
  for (size_t i = 0; i < rails.size(); ++i) completed[i] = running[i] = 0;
  if (!(opt.failover && hooks.on_rail_error)) return;
  watchdog = std::make_unique<RailWatchdog>(
      rails.size(), opt.stall_s,
      [this](int rail) {
        auto c = rails[rail]->counters();
        return c.bytes_sent + c.bytes_received;
      },
      [this](int rail, const std::string& what) {
        hooks.on_rail_error(rail, what, /*stalled=*/true, running[rail] - 1);
      },
      [this](int rail) { return rails[rail]->link_fault(); },
      [this](int rail, const std::string& what) {
        // A certain failure: no check whether peers are merely late. On the last rail up it is
        // left to the silence limit and the operation's deadline, as a stall is (a cable
        // plugged back within NEZHA_TIMEOUT_S then costs a pause, not the job).
        int up = 0;
        for (size_t i = 0; i < rails.size(); ++i)
          up += table && table->state(static_cast<int>(i)) == multirail::RailState::kUp;
        const bool certain = !table || up >= 2;
        hooks.on_rail_error(rail, what, /*stalled=*/!certain, running[rail] - 1);
      },
      [this](int rail, std::chrono::milliseconds quiet) { return rails[rail]->delivering(quiet); });
}

TaskContext::~TaskContext() = default;

collectives::CollectiveOptions TaskContext::collective_options(uint64_t seq, double timeout_s) const {
  collectives::CollectiveOptions copt;
  copt.seq = seq;
  copt.segment_bytes = opt.segment_bytes;
  copt.logstep_max_bytes = opt.logstep_max_bytes;
  copt.halving_max_bytes = opt.halving_max_bytes;
  copt.deadline = Deadline::after_seconds(timeout_s);
  return copt;
}

transport::PointToPointRail& TaskContext::point_to_point(int rail, const std::string& what) const {
  transport::PointToPointRail* p2p = rails[static_cast<size_t>(rail)]->as_point_to_point();
  if (!p2p)
    throw InvalidArgument("rail '" + rails[static_cast<size_t>(rail)]->properties().name +
                          "' is a collective rail: it runs only allreduces and the operations of every rank it runs "
                          "itself, not the " + what);
  return *p2p;
}

transport::HostLane* TaskContext::host_lane(int rail) const {
  transport::PointToPointRail* p2p = rails[static_cast<size_t>(rail)]->as_point_to_point();
  return p2p ? p2p->host_lane() : nullptr;
}

void TaskContext::allreduce_on(int rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                               const collectives::CollectiveOptions& copt, std::vector<double>* call_seconds) {
  transport::Rail& r = *rails[static_cast<size_t>(rail)];
  if (transport::CollectiveRail* coll = r.as_collective()) {
    collectives::allreduce(*coll, in, out, count, dtype, op, copt);
  } else if (transport::HostLane* lane = host_lane(rail)) {
    // In place only: the copy writes the input itself, nothing before_overwrite must hear of.
    if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
    collectives::allreduce_hierarchical(lane->lane(), lane->network(), lane->placement(), out, count, dtype, op,
                                        copt);
  } else if (call_seconds) {
    CallTimingRail timed(point_to_point(rail, "allreduce"), *call_seconds);
    collectives::allreduce(timed, in, out, count, dtype, op, copt);
  } else {
    collectives::allreduce(point_to_point(rail, "allreduce"), in, out, count, dtype, op, copt);
  }
}

void TaskContext::observe(int rail, size_t bytes, Clock::time_point start, const std::string& what, bool measure,
                          const std::vector<double>* call_seconds) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rail_secs =
      call_seconds ? multirail::rail_share_seconds(secs, *call_seconds,
                                                   table ? table->own_predicted_seconds(rail, bytes) : 0.0)
                   : secs;
  if (measure && table) table->observe(rail, bytes, rail_secs);
  if (observer) observer(rail, bytes, start, secs, rail_secs, what);
}

void TaskContext::started(ShareTask& task) {
  running[task.rail()] = task.seq + 1;
  if (opt.failover) ledger.set_state(task, ShareTask::State::kRunning);
}

void TaskContext::done(ShareTask& task) {
  completed[task.rail()] = task.seq + 1;
  running[task.rail()] = 0;
  if (opt.failover) ledger.set_state(task, ShareTask::State::kDone);
}

bool TaskContext::lost(ShareTask& task, const std::string& what) {
  running[task.rail()] = 0;
  if (!opt.failover || !ledger.mark_lost(task)) return false;
  hooks.on_rail_error(task.rail(), what, /*stalled=*/false, task.seq);
  return true;
}

std::string TaskContext::fatal_error(const Response& resp) const {
  if (!ledger.failed()) return {};
  return std::string(op_type_name(resp.type)) + " of " + names_str(resp) + ": " + ledger.reason();
}

}  // namespace nezha::engine
