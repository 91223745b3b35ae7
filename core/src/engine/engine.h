// The per-process engine: the composition root. It builds the rails, the control channel and the
// rail table, constructs the components, wires them to each other, owns their lifetimes, and runs
// the background loop. No globals: tests run several engines (ranks) in one process.
//
// The components, each behind its own header, meet only through what the engine wires:
//   Submissions (submissions.h)       the tensors callers submitted and the engine has not executed
//   Negotiator (negotiation/negotiator.h)  routing, rank 0's coordinator and dispatch, the ordered
//                                     response stream, cache rounds, heartbeats and liveness
//   FailoverController (failover/failover_controller.h)  rail events, the completed watermark,
//                                     RailFailover's decisions, re-admission
//   Executor (execution/executor.h)   runs agreed operations on the rails' workers
//   ../multirail/rail_table.h         per-rail cost models, states and shares; the one planner entry
// Files: engine.cc (construction, wiring, submit, shut down), engine_loop.cc (the loop and leading
// it), engine_rails.cc (building and calibrating the rails), engine_vote.cc (the host board: a
// one-host job's small allreduces agreed without rank 0, negotiation/host_vote.h). Includes run one way: the shared types
// at the top level <- the component folders <- these files (scripts/include_graph.py checks it).
//
// Why the background loop looks the way it does:
//  1. Callers submit from any thread and must never block on the network: enqueue() only appends
//     to a queue and wakes the loop through an eventfd.
//  2. A lone operation must not wait for a timer: the loop sleeps (epoll) on the control
//     connections and that eventfd, and forwards new work the moment it wakes.
//  3. Rank 0 must stay responsive as coordinator while data moves: execution happens on per-rail
//     worker threads, never on the loop.
//  4. Every wait is bounded: control messages, connections and collectives all carry deadlines,
//     and a peer lost on the control channel fails every pending operation with its name.
//  5. A small operation's time is mostly thread hand-offs (caller -> loop thread -> rank 0 -> loop
//     thread -> caller), each a wake-up of a sleeping thread. So a caller about to wait for one may
//     lead the loop itself for a bounded time (leader/follower, enqueue_all's lead_s): while the
//     loop thread sleeps, the caller takes the loop's lock and the control connections out of the
//     loop thread's epoll set (which wakes no one), runs the loop's passes until its operations are
//     done, then hands both back; the loop thread is woken only when a timer it sleeps past is due
//     sooner. Work other threads submit meanwhile (or a failover report, a shutdown) wakes the loop
//     thread and ends the lead, so the loop thread takes it at once. The loop's state is touched
//     only under loop_mu_, by one thread at a time. An operation that leaves negotiation as one
//     rail's task is then run by a leading caller that waits for it however long it takes (not
//     jit's bounded wait), once it has handed the loop back (so the loop thread still reacts to
//     that rail's failure): no wake-up of the rail's worker, and none of the caller when the worker
//     is done (Executor::begin_caller_lead). Callers that lead: nezha.jax inside jit (NEZHA_JAX_WAIT_US) and every synchronous
//     Python call, numpy's and nezha.torch's (NEZHA_LEAD_US; bindings/module.cc, nezha/ops.py).
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/execution/executor.h"
#include "engine/failover/failover_controller.h"
#include "engine/handle.h"
#include "engine/negotiation/control_channel.h"
#include "engine/negotiation/host_vote.h"
#include "engine/negotiation/negotiator.h"
#include "engine/process_sets.h"
#include "engine/request.h"
#include "engine/submissions.h"
#include "engine/timeline.h"
#include "multirail/cost_model.h"
#include "multirail/rail_table.h"
#include "transport/rail.h"
#include "transport/rail_factory.h"

namespace nezha::engine {

// One rail as the user listed it (nezha/rails.py resolved it); built by transport::make_rail().
struct RailConfig {
  std::string name;
  std::string local_addr;            // IP to bind for network kinds; empty for shm
  std::string kind = "tcp";          // "tcp", "mptcp", "shm", ... (transport/rail_kinds.cc)
  std::map<std::string, std::string> options;  // kind-specific, passed to the factory untouched
  // Added by Nezha, not named by the user (the automatic shm lane, NEZHA_AUTO_SHM): dropped rather
  // than refused where it cannot serve.
  bool automatic = false;
};

struct EngineConfig {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::vector<RailConfig> rails;
  std::string secret;
  std::string host_id;  // the launcher's host entry for this rank (host-local rails; may be empty)
  // Control path address for a rail that has no network address of its own (shm): the address
  // that reaches the rendezvous (nezha/basics.py sets it).
  std::string control_addr = "127.0.0.1";
  size_t fusion_threshold = 64 << 20;
  size_t unfused_bytes = 1 << 20;  // NEZHA_UNFUSED_BYTES: see runs_unfused() (request.h)
  double cycle_time_ms = 1;
  double timeout_s = 30;
  double connect_timeout_s = 60;
  double stall_check_s = 60;
  double stall_shutdown_s = 0;
  size_t logstep_max_bytes = 65536;
  size_t halving_max_bytes = 262144;  // NEZHA_HALVING_MAX_BYTES
  size_t segment_bytes = 1 << 20;
  size_t balance_bytes = 1 << 20;  // NEZHA_BALANCE_BYTES: see ExecutorOptions::balance_bytes
  size_t socket_buffer_bytes = 4 << 20;
  std::string timeline_path;  // NEZHA_TIMELINE: empty = no timeline
  double rail_stall_ms = 100;  // NEZHA_RAIL_STALL_MS: see ExecutorOptions::stall_s
  // NEZHA_RAIL_FAILOVER: with several rails, keep input copies and fail rails over (off: a rail
  // failure fails the operations on it, named, and saves one memcpy per operation).
  bool rail_failover = true;
  // Re-admission back-off of a failed rail (doubles while it flaps, up to the max).
  double rail_probe_backoff_s = 0.25;
  double rail_probe_backoff_max_s = 3;
  bool cache_rounds = false;  // NEZHA_CACHE_ROUNDS: cached allreduces skip rank 0 (cache_rounds.h)
  // NEZHA_HOST_VOTE: a one-host job's small cached allreduces from synchronous callers are agreed
  // and reduced on the host board, without rank 0 (negotiation/host_vote.h). Rank 0's decides.
  bool host_vote = true;
  // NEZHA_HOST_VOTE_SPIN_US: how long a voter yields the CPU in a loop, looking at the board, before
  // it sleeps on it (see run_host_vote()).
  double host_vote_spin_us = 50;
  // NEZHA_SHM_CONTROL: ranks sharing a host negotiate through shared memory (shm_message_path.h).
  bool shm_control = true;
  // NEZHA_CONTROL_SPIN_US: how long a leading caller polls the shared-memory control path before it
  // sleeps (see lead()).
  double control_spin_us = 50;
  // NEZHA_CONTROL_INLINE_BYTES: small collectives done by rank 0 inside negotiation (control_inline.h).
  size_t control_inline_bytes = 16384;
  // NEZHA_HIERARCHICAL: with a host-local rail (shm) beside network rails on a job whose hosts hold
  // several ranks, allreduces go hierarchical (see build_rails()); off: a host-local rail that does
  // not reach every rank is refused (named by the user) or dropped (automatic).
  bool hierarchical = true;
  // NEZHA_HOST_LANE: what runs the hierarchical allreduce's phases inside a host across hosts: the
  // collective shm rail ("shmcoll": one pass over memory per phase) or the shm ring ("shm").
  std::string host_lane = "shmcoll";
  // NEZHA_OUTPUT_CACHE_BYTES: idle large results kept for reuse (output_pool.h).
  size_t output_cache_bytes = size_t{512} << 20;

  // Defaults from the knob table (NEZHA_* environment variables).
  static EngineConfig from_knobs();
};

// Where executed tensors were scheduled (counts of tensors, this rank).
struct EngineStats {
  uint64_t tensors_via_rounds = 0;       // by a cache round, without rank 0
  uint64_t tensors_via_coordinator = 0;  // by a response from rank 0
  uint64_t tensors_done_by_coordinator = 0;  // of those: done by rank 0 in negotiation, no rail
  uint64_t requests_to_coordinator = 0;  // tensor requests this rank sent to rank 0
  // Host votes (negotiation/host_vote.h): tensors this rank reduced from the board, and those it
  // took to rank 0 after all (some rank did not vote, or the board was broken).
  uint64_t tensors_by_host_vote = 0, host_votes_diverted = 0;
  uint64_t rounds = 0;                   // cache rounds completed
  uint64_t operations_on_rails = 0;     // operations this rank ran on the rails (fused: one)
  uint64_t callers_led = 0;  // times a caller ran the loop itself (enqueue_all's lead_s)
  uint64_t shares_run_by_callers = 0;  // tasks a leading caller ran itself (Executor::run_held_here)
  uint64_t bytes_staged = 0;  // allreduce inputs copied before their rails started (Executor::bytes_staged)
  uint64_t bytes_kept_for_redo = 0;  // inputs copied aside for failover (Executor::bytes_kept_for_redo)
  // Control messages this rank sent through shared memory (ranks of its host) and over the network.
  uint64_t control_messages_shared_memory = 0, control_messages_network = 0;
  // Large results (allgather, alltoall, reducescatter) of this process: blocks reused from the
  // output pool and blocks newly allocated (output_pool.h).
  uint64_t output_blocks_reused = 0, output_blocks_allocated = 0;
};

struct RailStat {
  std::string name, local_addr, kind, state;
  uint64_t bytes_sent = 0, bytes_received = 0;  // a rail with a host lane: both rails' together
  uint64_t lane_bytes_sent = 0;  // of bytes_sent: through the rail's host lane (shared memory)
  double alpha_us = 0, beta_gbps = 0, share = 0;
  double bulk_alpha_us = 0, mid_alpha_us = 0, mid_beta_gbps = 0;  // multirail::RailEstimate
  uint64_t min_striped_bytes = 0;                                  // multirail::RailEstimate
};

class Engine {
 public:
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // What other ranks need to reach this one: [control path per rail..., rail 0, rail 1, ...]. Opaque
  // bytes (Rail::local_address(); any byte may occur): carry them as bytes.
  std::vector<std::string> listen_addresses() const;
  // addrs_by_rank[r] is rank r's listen_addresses(). Forms every connection, starts the loop.
  // Throws InvalidArgument naming a host-local rail (RailReach::kHost) left standing alone (not a
  // host lane of the network rails, see build_rails()) that does not reach every rank.
  void connect_and_start(const std::vector<std::vector<std::string>>& addrs_by_rank);

  // Submits one tensor. Throws InvalidArgument for bad input (name in flight, engine stopped).
  std::shared_ptr<OpHandle> enqueue(TensorEntry entry);
  // Submits several tensors at once (a group's members): all are queued, or none is (the first bad
  // one throws as enqueue() would). lead_s > 0: when the loop thread is asleep, the calling thread
  // runs the loop until every returned handle is done or lead_s has passed (point 5 above) instead
  // of waking the loop thread; for callers about to wait for small operations. `waits_to_end`: the
  // caller waits for the handles whatever it takes (a synchronous Python call, not jit's bounded
  // wait), so it also runs an operation that left for one rail itself (point 5).
  std::vector<std::shared_ptr<OpHandle>> enqueue_all(std::vector<TensorEntry> entries, double lead_s = 0,
                                                     bool waits_to_end = false);

  // Process sets (process_sets.h). Every rank registers the same sets in the same order, so ids
  // agree (the Python layer checks that they do). A set with tensors in flight on this rank cannot
  // be removed (InvalidArgument naming them).
  int32_t add_process_set(std::vector<int> ranks);
  bool remove_process_set(int32_t id);
  // The pair set of ranks a and b (process_sets.h): registered nowhere, known everywhere.
  int32_t pair_process_set(int a, int b) const { return process_sets_->pair_id(a, b); }
  // The members of set `id`, in rank order; InvalidArgument if no such set.
  std::vector<int> process_set_ranks(int32_t id) const;
  std::vector<int32_t> process_set_ids() const { return process_sets_->ids(); }

  // Finishes local work, agrees with the other ranks to stop (bounded by timeout_s), closes.
  void shutdown();

  std::vector<RailStat> rail_stats() const;
  EngineStats stats() const;

  // Tests: makes `rail` fail on this rank only, as a NIC error would (its data calls throw; the
  // peers just stop hearing from it on that rail).
  void testing_fail_rail(int rail, const std::string& why) { rails_.at(rail)->abort(why); }
  const EngineConfig& config() const { return config_; }

 private:
  void loop();
  // One pass of the loop: new work, timers, rank 0's dispatch, then one wait (through `wait`) for
  // a control message, new work (not for a leader) or the next timer. Sets finished_ when the loop
  // must end.
  void loop_pass(const ControlChannel::Wait& wait, bool leader);
  Clock::time_point next_wakeup(Clock::time_point now) const;  // the loop's timers, not the channel's
  void lead(const std::vector<std::shared_ptr<OpHandle>>& handles, const std::vector<std::string>& names,
            double lead_s, bool waits_to_end);
  // A leader about to sleep: polls the control channel for up to control_spin_us (a host path
  // only); true once something is there to read. Backs off after kSpinMissesBeforeBackoff misses
  // in a row: the next kSpinBackoffWaits waits sleep at once.
  bool spin_for_control();
  static constexpr int kSpinMissesBeforeBackoff = 4;
  static constexpr int kSpinBackoffWaits = 64;
  void build_rails();  // engine_rails.cc
  void calibrate_rails();  // engine_rails.cc
  void refuse_partial_host_rails() const;  // see connect_and_start()
  // connect_and_start(): the failover controller and the executor, then (after calibration) the
  // negotiator, each wired to the others through closures over these members.
  void wire_components(const std::vector<std::vector<std::string>>& addrs_by_rank);
  void make_negotiator();
  // After the control channel connected: the host board, if this job has one (host_vote.h).
  void set_up_host_vote();
  // A synchronous caller's lone entry (queued, not handed to negotiation): votes on the host board
  // and completes it, or hands it to negotiation (false) when some rank did not vote or the board
  // broke. engine_vote.cc.
  bool run_host_vote(const HostVote::Step& step, const std::shared_ptr<OpHandle>& handle, const std::string& name,
                     const void* input);
  void fail_everything(const std::string& reason);
  void wake();
  // Failover is on, and some rail's shares could be redone elsewhere (failover/redo_scope.h).
  bool failover_needed() const;

  EngineConfig config_;
  OutputPool::Attachment output_pool_;  // keeps large results for reuse while this engine lives
  std::unique_ptr<ProcessSetTable> process_sets_;  // read by the negotiator and the executor
  std::unique_ptr<ControlChannel> control_;
  std::vector<std::unique_ptr<transport::Rail>> rails_;  // built by transport::make_rail()
  // Per rail: cost models, states, shares, shared estimates, probe counters (rail_table.h). Rail
  // workers report to it; the negotiator plans with it; failover sets the rails' states.
  std::unique_ptr<multirail::RailTable> rail_table_;
  Timeline timeline_;
  Submissions submissions_;  // shared between callers and the loop
  // Built in connect_and_start(); destroyed in reverse: the executor's workers (which report to
  // the failover controller) first.
  std::unique_ptr<FailoverController> failover_;
  std::unique_ptr<Negotiator> negotiator_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<HostVote> host_vote_;  // a one-host job's board (set before the loop starts)
  std::atomic<uint64_t> tensors_by_host_vote_{0}, host_votes_diverted_{0};
  int wake_fd_ = -1;

  // The loop's: under loop_mu_, held by whichever thread runs the loop (the loop thread, or a
  // caller leading it: point 5); the loop thread drops it only while it waits.
  std::mutex loop_mu_;
  int loop_epoll_ = -1;  // the loop thread's wait: wake_fd_ and, unless a caller leads, control_->watch_fd()
  bool control_spins_ = false;  // a shared-memory control path and a spin time: see spin_for_control()
  int spin_misses_ = 0, spin_skips_ = 0;  // spin_for_control()'s back-off (the lead's thread, under loop_mu_)
  int lead_epoll_ = -1;  // a leading caller's wait: control_->watch_fd() and wake_fd_ (which ends the lead)
  std::atomic<uint64_t> leads_{0};  // times a caller led the loop (changed under loop_mu_)
  Clock::time_point loop_sleeps_until_{};  // the loop thread's current wait ends by then
  std::optional<Clock::time_point> shutdown_deadline_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace nezha::engine
