// Negotiation on every rank: routes this rank's new tensors (to rank 0, or to the cache rounds),
// on rank 0 coordinates (plans each response with the rail table and sends it to every rank in
// one order), takes the control messages, runs the cache rounds, and hands what was agreed to
// the executor in that order. It also keeps the control channel alive (heartbeats) and watches
// the peers (liveness).
//
// The ordering contract: every rank hands responses and rank 0's rail events to NegotiatorLinks in
// the same total order (cache_rounds.h argues it), so per-rail operation sequences agree.
//
// It meets the executor and failover only through NegotiatorLinks, which the engine wires; it
// includes neither side's headers.
//
// Threads: everything runs on the thread that runs the engine's loop (the loop thread or a caller
// leading it), one at a time; stats() from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "engine/negotiation/cache_rounds.h"
#include "engine/negotiation/control_channel.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/message_codec.h"
#include "engine/process_sets.h"
#include "engine/rail_event.h"
#include "engine/submissions.h"
#include "engine/tensor_entry.h"
#include "engine/timeline.h"
#include "multirail/rail_table.h"

namespace nezha::engine {

// What negotiation hands on, wired by the engine.
struct NegotiatorLinks {
  // The executor: runs an agreed response with this rank's entries (absent ones default-built);
  // steps its rails' operation counters past another process set's response; drops input copies
  // of shares every rank has completed.
  std::function<void(const Response& resp, std::vector<TensorEntry> entries)> execute;
  std::function<void(const Response& resp)> skip;
  std::function<void(const std::vector<uint64_t>& watermark)> trim;
  // Failover: this rank's completed counts (empty when failover is off), rank 0's watermark, what
  // a rank reported (rank 0), and rank 0's decisions in stream order (every rank).
  std::function<std::vector<uint64_t>()> completed;
  std::function<std::vector<uint64_t>()> watermark;
  std::function<void(int rank, const std::vector<uint64_t>& completed)> completed_from;
  std::function<void(int rank, const std::vector<RailEvent>& events)> rail_events_from;
  std::function<void(const RailEvent& event)> apply_rail_event;
  // The engine: rank 0 said the job cannot go on.
  std::function<void(const std::string& reason)> fail;
  // A response that caches names[index] ran with this rank's request `own` (host_vote.h); optional.
  std::function<void(const Request& own, const Response& resp, size_t index)> learned;
};

struct NegotiatorOptions {
  int rank = 0, size = 1;
  double timeout_s = 30;
  double stall_check_s = 60;
  size_t control_inline_bytes = 16384;  // see control_inline.h
  std::vector<std::string> rail_names;
  CoordinatorOptions coordinator;  // rank 0
  CacheRoundsOptions rounds;
};

// Where executed tensors were scheduled (counts of tensors, this rank); EngineStats reports them.
struct NegotiatorStats {
  uint64_t tensors_via_rounds = 0, tensors_via_coordinator = 0, tensors_done_by_coordinator = 0;
  uint64_t requests_to_coordinator = 0, rounds = 0, operations_on_rails = 0;
};

class Negotiator {
 public:
  // Idle ranks exchange an empty control message this often, so a rank that stopped (SIGSTOP, a
  // hung host) is told apart from one that has nothing to submit.
  static constexpr double kHeartbeatS = 1.0;
  static constexpr double kSwitchPathAfterS = 2.5 * kHeartbeatS;
  // check_liveness() looks at the clocks at most this often. Its limits are seconds, and the loop
  // runs a pass per control message: rank 0 of a star would otherwise walk every rank once per
  // request, O(n^2) per operation (at 128 ranks 40 % of rank 0's instructions per 8 B allreduce).
  static constexpr double kLivenessCheckS = 0.02;

  Negotiator(NegotiatorOptions opt, ControlChannel& control, multirail::RailTable& table, Submissions& submissions,
             const ProcessSetTable& process_sets, Timeline& timeline, NegotiatorLinks links);

  // New tensors to rank 0 or the cache rounds; then whatever the rounds allow runs.
  void forward_new_work();
  // Rank 0: dispatches what the coordinator has ready (and stall errors), sends its notices.
  // Returns true once every rank asked to shut down (the goodbye is sent: the loop ends).
  bool coordinate(Clock::time_point now);
  // Rank 0, after coordinate(): how many control messages must come, at least, before it has
  // anything to coordinate (Coordinator::fewest_requests_missing); 1 on every other rank, with
  // cache rounds (their vectors are messages too) and while a join waits for a round.
  int requests_awaited() const;
  // A control message from `peer`. Returns true when the loop must end (rank 0's goodbye or fatal).
  bool on_control_message(int peer, const std::string& payload);
  void send_heartbeats(Clock::time_point now);
  // Throws TimeoutError naming a peer silent for timeout_s (or late with a cache round).
  void check_liveness(Clock::time_point now);
  void warn_round_stalls(Clock::time_point now);
  Clock::time_point next_wakeup(Clock::time_point now) const;
  // A lost control connection to `peer` that is no failure (it said goodbye, or shutdown is on).
  bool control_loss_expected(int peer) const;
  // Rank 0, best effort: tells every worker why the job ends.
  void broadcast_fatal(const std::string& reason);

  // Failover's messages: a worker's rail events to rank 0; rank 0's to every rank, in order.
  void send_rail_events(std::vector<RailEvent> events);
  void broadcast_in_order(std::vector<RailEvent> events);

  NegotiatorStats stats() const;

 private:
  void route_new_work();
  void send_requests(RequestList list, bool send_shutdown);
  void dispatch(std::vector<Response> responses);
  // Rank 0: sends `list` (with the watermark) to every worker and executes it here, at the same
  // point of the ordered stream.
  void send_in_order(ResponseList list);
  std::vector<multirail::RailShare> plan_for(const Response& r);
  void execute_locally(const ResponseList& list, bool from_round = false);
  void complete_inline(const Response& resp, std::vector<TensorEntry>& entries);
  void pump_rounds();
  void execute_round(RoundOutcome& outcome);
  void send_round(RoundMessage msg);
  void send_notices(std::vector<std::string> notices);
  std::string me() const { return "rank " + std::to_string(opt_.rank) + ": "; }

  NegotiatorOptions opt_;
  ControlChannel& control_;
  multirail::RailTable& table_;
  Submissions& submissions_;
  const ProcessSetTable& process_sets_;
  Timeline& timeline_;
  NegotiatorLinks links_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<CacheRounds> rounds_;       // the response cache and the cache rounds

  std::vector<Response> held_dispatch_;  // rank 0: responses waiting behind a join (cache_rounds.h)
  bool pumping_ = false;
  bool shutdown_sent_ = false;
  std::vector<bool> peer_shutdown_;
  std::vector<Clock::time_point> last_heard_;        // per peer: last control message (heartbeats too)
  std::vector<Clock::time_point> path_switched_at_;  // per peer: last_heard_ when we last switched
  Clock::time_point last_sent_;                      // last control message this rank sent
  Clock::time_point liveness_checked_at_;            // check_liveness(): the last full look
  bool last_plan_striped_ = false;                   // rank 0: for cold/hot transition logs
  std::atomic<uint64_t> tensors_via_rounds_{0}, tensors_via_coordinator_{0}, tensors_done_by_coordinator_{0};
  std::atomic<uint64_t> operations_on_rails_{0}, requests_to_coordinator_{0}, rounds_completed_{0};
};

}  // namespace nezha::engine
