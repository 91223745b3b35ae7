// Every rank's side of rail failover and re-admission (the protocol is in rail_failover.h): takes
// the rail events rail workers and the watchdog report, decides on rank 0 (RailFailover), applies
// rank 0's decisions in stream order, and keeps the completed watermark below which no share can
// be redone.
//
// It meets the rest of the engine only through the two structs below, which the engine wires:
// RailWork reaches the executor (the rails' workers), FailoverLinks reaches negotiation (the control
// channel and the ordered response stream). It never includes either side's headers.
//
// Threads: report() from any thread (rail workers, the watchdog); everything else on the thread
// that runs the engine's loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "engine/failover/rail_failover.h"
#include "engine/rail_event.h"
#include "multirail/rail_table.h"
#include "transport/rail.h"

namespace nezha::engine {

// The executor's side: what failover asks of the rails' workers.
struct RailWork {
  std::function<std::vector<uint64_t>()> completed;  // per rail: 1 + seq of the last completed operation
  std::function<uint64_t(int rail)> running;           // 1 + seq of the operation running, 0: none
  std::function<void(int rail, std::function<void()> task)> post_task;  // after what the rail has queued
  std::function<void(int rail, size_t bytes, std::function<void()> prepare,
                     std::function<void(const std::string& error)> done)> post_probe;
  std::function<void(int rail, uint64_t first, int target)> redo;
};

// Negotiation's side: how events travel.
struct FailoverLinks {
  std::function<void(int rail, bool avoid)> avoid_path;  // keep the control channel off a rail
  // A worker's events to rank 0 (with this rank's completed counts).
  std::function<void(std::vector<RailEvent> events)> send_to_coordinator;
  // Rank 0: events to every rank, itself included, at the current point of the ordered stream.
  std::function<void(std::vector<RailEvent> events)> broadcast_in_order;
  std::function<void()> wake;  // the loop: a report is queued
};

struct FailoverOptions {
  int rank = 0, size = 1;
  // Failover on (NEZHA_RAIL_FAILOVER, several rails, several ranks); off, the controller only
  // applies nothing and reports empty watermarks.
  bool enabled = false;
  multirail::RailHealthOptions health;
  // Per rail: whether a failed rail's work may be redone on it (RailFailover::set_redo_targets).
  std::vector<bool> redo_targets;
  // Per rank, per rail: the data rails' listen addresses (re-admission reconnects with them).
  std::vector<std::vector<std::string>> rail_addrs_by_rank;
};

class FailoverController {
 public:
  FailoverController(FailoverOptions opt, std::vector<transport::Rail*> rails, multirail::RailTable& table,
                     RailWork work, FailoverLinks links);

  bool enabled() const { return opt_.enabled; }
  // Any thread: queues an event of this rank for the loop and wakes it.
  void report(RailEvent event);
  // The loop: sends (or, on rank 0, decides on) the events queued by report().
  void handle_reports();
  // Rank 0: events a rank sent; throws ProtocolError for one only rank 0 sends, NezhaError when
  // the job cannot go on.
  void on_events_from(int rank, const std::vector<RailEvent>& events);
  // Rank 0: a rank's completed counts (from its requests or heartbeats); ignored when off.
  void on_completed_from(int rank, const std::vector<uint64_t>& completed);
  // Every rank, in stream order: one of rank 0's decisions.
  void apply(const RailEvent& e);
  // Rank 0: starts re-admissions whose back-off is over.
  void start_due_probes(Clock::time_point now);
  std::optional<Clock::time_point> next_wakeup() const;
  // Rank 0: per rail, the least completed count over every rank (empty when off): shares below it
  // are done everywhere, so their input copies may go.
  std::vector<uint64_t> watermark() const;
  // This rank's completed counts when failover is on (rank 0 needs them), else empty.
  std::vector<uint64_t> completed_if_enabled() const;

 private:
  void decide(RailFailover::Decision d);
  void broadcast(std::vector<RailEvent> events);
  const std::string& rail_name(int rail) const { return rails_[rail]->properties().name; }

  FailoverOptions opt_;
  std::vector<transport::Rail*> rails_;
  multirail::RailTable& table_;
  RailWork work_;
  FailoverLinks links_;
  std::unique_ptr<RailFailover> failover_;  // rank 0 only, when enabled
  std::vector<std::vector<uint64_t>> completed_by_rank_;  // rank 0: each rank's last report
  std::vector<bool> failure_reported_;  // per rail: this rank already reported it failed

  std::mutex mu_;
  std::vector<RailEvent> reports_;  // from report(), for the loop
};

}  // namespace nezha::engine
