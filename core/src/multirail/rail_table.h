// The rail table: everything the engine knows about its rails' performance and health, and the one
// place operations are planned over them.
//
// What it owns, per rail: the cost model (SplitRegimeModel, fed by the rail workers through
// observe()), the rail's state (up / down / probing, set by failover in stream order), its current
// share of allreduce payloads (rail_stats()), the probe counters that lend idle rails a small share,
// and rank 0's estimates as last received (every rank reports the coordinator's model, the one that
// decides the splits). It also seeds each model from the transport's priors (RailProperties
// latency_us_prior / gbps_prior) until the rail has been measured, and honours max_share_bytes.
//
// Striping is checked on whole operations where it may not pay (StripingCheck): an allreduce the
// models would stripe runs whole below the coordinator's min_striped_bytes, and a few of each size
// class's such plans go the other way (check_explores), so both stay measured.
//
// Planning: plan() is the only entry point, used by negotiation (rank 0 plans from its own models)
// and by cache rounds (every rank plans from rank 0's estimates carried in the round), so both
// agree with each other's rules. Operations that are not split (everything but allreduce) get an
// explicit single-rail pick. Each source has its own probe counters: round plans must come out the
// same on every rank, so their counters advance only in the total order of rounds.
//
// Threads: observe() from rail workers, the rest from the engine thread, stats() from any thread.
#pragma once

#include "common/dtype.h"

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "multirail/cost_model.h"
#include "multirail/planner.h"
#include "multirail/rail_health.h"
#include "multirail/split_regime_model.h"
#include "multirail/striping_check.h"

namespace nezha::multirail {

// Allreduces of at least this many bytes go to a collective host-memory rail (shmcoll) rather than a
// point-to-point one (the shm ring) without asking the cost models. Per rank both move the same
// bytes through memory, but the collective rail pipelines fixed chunks with one synchronisation
// each, where the ring steps 2(n-1) times in lock-step with its neighbours; on a 2-core host with 4
// ranks it was faster on average from 64 KiB to 64 MiB, and its lead grows with the ranks. The
// models cannot be trusted to see it: calibrated on payloads up to 2 MiB, on a loaded host they
// swapped the two from run to run and gave one run's 64 MiB allreduces to the ring at 1.8x the
// collective rail's time (benchmarks/SHM.md). Latency-bound payloads below this (log-step against
// one wait) are left to the models.
constexpr size_t kCollectiveHostMemoryBytes = kLatencyBoundBytes;

// The operations besides allreduce that a collective rail may run (transport::CollectiveOp), as the
// plan names them: a collective rail runs one of them whole (never striped: the striped forms balance
// their ranges with messages, which a collective rail does not carry).
enum class RailOp : uint8_t { kNone, kBroadcast, kAllgather, kReducescatter, kAlltoall };

// What the table needs to know about one rail (from transport::RailProperties).
struct RailDescription {
  std::string name;
  double latency_us_prior = 0;  // 0 = unknown
  double gbps_prior = 0;        // 0 = unknown; with a prior the rail is planned before any sample
  size_t max_share_bytes = 0;   // 0 = no limit
  // Capabilities, from the rail's kind (transport::Rail::as_point_to_point(), CollectiveRail::reduces
  // and runs): a rail that is not point to point carries only allreduces it reduces itself (reduces
  // may be empty: none) and the operations `runs` names (empty: none; a reducescatter also needs
  // reduces).
  bool point_to_point = true;
  std::function<bool(DataType, ReduceOp)> reduces;
  std::function<bool(RailOp)> runs;
  // transport::RailProperties::host_memory: the rail's data moves through this host's memory.
  bool host_memory = false;
};

// The bandwidth a rail's cost model should expect before it is measured, from the speed of its
// links: the model fits a share's whole time (the algorithm included), and a collective rail moves a
// share of N bytes through each link once (alpha + N / L), a ring 2(n-1)/n N (alpha + 2(n-1)/n N / L).
// So at equal links an aggregation rail is worth n / (2(n-1)) ring rails: 1.5 at n = 4, -> 2.
double share_gbps_prior(double link_gbps, bool collective_rail, int ranks);

// What to plan: `count` elements of `elem_size` bytes; `splittable` (a collective that moves data)
// may be striped, anything else runs whole on one rail. Only an allreduce of every rank may go to a
// collective rail (one that reduces in the network), and only if it reduces dtype/op; or, whole, a
// broadcast, allgather, reducescatter or alltoall of every rank (`other`) that the rail runs.
struct OpToPlan {
  size_t count = 0;
  size_t elem_size = 1;
  bool splittable = false;
  bool allreduce = false;
  DataType dtype = DataType::kFloat32;  // what a collective rail must reduce to take a share
  ReduceOp op = ReduceOp::kSum;
  RailOp other = RailOp::kNone;  // not an allreduce: which operation of every rank, if a collective rail may run it
};

enum class PlanSource {
  kNegotiation,  // rank 0, from its own models
  kRound,        // any rank, from rank 0's estimates carried in a cache round
};

struct RailStatus {
  RailState state = RailState::kUp;
  RailEstimate estimate;  // rank 0's as last received, else this rank's (with priors)
  double share = 0;       // of the last allreduce plan executed
};

class RailTable {
 public:
  RailTable(std::vector<RailDescription> rails, RailCostModelOptions options);

  size_t size() const { return rails_.size(); }
  const RailDescription& rail(int index) const { return rails_.at(static_cast<size_t>(index)); }

  // Rail workers: one share of `bytes` took `seconds` on `rail`.
  void observe(int rail, size_t bytes, double seconds);
  // What this rank's own model of `rail` predicts for a share of `bytes` (the model observe()
  // feeds); 0 while it knows too little.
  double own_predicted_seconds(int rail, size_t bytes) const;
  // The executor: an allreduce of `bytes` of every rank took `seconds` on this rank from its shares
  // being posted to its result, `striped` over several rails or whole on one (StripingCheck; rank
  // 0's verdict over every rank's times goes out as every estimate's min_striped_bytes). On rank 0
  // it is checked at once; on the others (report_operations_to_coordinator) it waits in an outbox
  // for take_operation_times().
  void observe_operation(size_t bytes, bool striped, double seconds);
  void report_operations_to_coordinator();
  // The times observed since the last call (at most kMaxReportedOperations, the latest), for the
  // next message to rank 0.
  std::vector<OperationTime> take_operation_times();
  // Rank 0: a peer's times, from its message. Throws InvalidArgument for rank 0 or a negative rank.
  void observe_rank_operations(int rank, const std::vector<OperationTime>& times);

  // This rank's estimates, with priors standing in for rails not measured yet.
  std::vector<RailEstimate> estimates() const;
  // Rank 0's estimates, as received with its response lists.
  void set_shared_estimates(std::vector<RailEstimate> estimates);

  void set_state(int rail, RailState state);  // not up: its current share drops to 0
  RailState state(int rail) const;
  std::vector<bool> usable() const;  // up, per rail
  // Up and able to carry `op`: a collective rail only for an allreduce it reduces, or an `other`
  // operation it runs.
  std::vector<bool> usable_for(const OpToPlan& op) const;

  // The plan of one operation. kNegotiation plans from estimates(); kRound from `round_estimates`
  // (rank 0's, identical on every rank). Returns a plan without shares (run whole on rail 0, as the
  // engine reads it) with a single rail, or for a round without estimates or a non-split operation; throws NezhaError when no rail
  // is usable. `on_probe` (may be empty) hears of each probe share.
  Plan plan(const OpToPlan& op, PlanSource source,
                              const std::vector<RailEstimate>& round_estimates = {},
                              const std::function<void(int rail, size_t bytes)>& on_probe = {});
  // Of the host-memory rails usable for an allreduce (or another operation a collective rail runs) of `bytes`, keeps the collective ones or the
  // point-to-point ones: the collective ones from kCollectiveHostMemoryBytes on, below it whichever
  // is predicted faster alone (see plan()).
  void keep_one_host_memory_kind(const std::vector<RailEstimate>& est, std::vector<bool>& usable,
                                 size_t bytes) const;
  // The single-rail pick for an operation that is not split: the usable rail with the lowest
  // start-up cost whose max_share_bytes admits `bytes` (any usable one if none does).
  int pick_single_rail(const std::vector<RailEstimate>& estimates, const std::vector<bool>& usable,
                       size_t bytes) const;

  // An allreduce plan was executed: its shares become the rails' current shares.
  void record_plan(const std::vector<RailShare>& shares);

  std::vector<RailStatus> status() const;

  // The payload sizes calibration runs on each rail before user traffic (alpha from the small
  // ones, beta and the bulk start-up from the others: three samples per regime of the
  // SplitRegimeModel, the large ones a factor 4 apart so a ring's start-up can be told from its
  // bandwidth where it matters, on fast rails and many ranks).
  static std::vector<size_t> calibration_bytes();

 private:
  RailEstimate estimate_locked(size_t rail) const;
  // An allreduce plan the models stripe, of a size StripingCheck checks: whole instead below the
  // usable rails' min_striped_bytes (from `request.rails`: the coordinator's), and such a plan the
  // other way where check_explores says so.
  void check_striping(Plan& plan, const PlanRequest& request, PlanSource source);
  // Whether collective rail `rail` runs `op` (an allreduce it reduces, or an `other` it runs).
  bool collective_runs(size_t rail, const OpToPlan& op) const;
  // The collective rail an `other` operation runs on whole, or -1: from kCollectiveHostMemoryBytes on
  // any usable collective rail (the lowest alpha), below it the usable rail of lowest alpha if that
  // one is collective.
  int whole_on_collective_rail(const OpToPlan& op, const std::vector<RailEstimate>& est,
                               const std::vector<bool>& usable) const;
  // Moves what exceeds a rail's max_share_bytes to usable rails without a limit (or with room).
  void cap_shares(Plan& plan, const std::vector<bool>& usable, size_t count, size_t elem_size) const;

  std::vector<RailDescription> rails_;
  mutable std::mutex mu_;  // guards everything below
  std::vector<SplitRegimeModel> models_;
  std::vector<RailEstimate> shared_estimates_;
  std::vector<RailState> states_;
  std::vector<double> current_share_;
  std::vector<int> idle_large_ops_[2];  // probe counters per PlanSource
  std::vector<StripingCheck> rank_checks_;  // by rank; [0]: this rank's own (on rank 0: the coordinator's)
  mutable uint64_t min_striped_bytes_ = 0;  // min_striped_bytes(rank_checks_) ...
  mutable bool min_striped_stale_ = false;  // ... unless new times came since
  bool reports_operations_ = false;
  // Per check class, this rank's last allreduce: 1 striped, 0 whole, -1 none yet.
  int last_checked_[kCheckClasses] = {-1, -1, -1, -1, -1, -1, -1};
  std::vector<OperationTime> outbox_;
  // Per PlanSource and check class: plans the models would stripe (the exploration's count).
  uint64_t contested_plans_[2][kCheckClasses] = {};
};

// Large payloads lend a small probe share to a rail that is unknown or idle for a while, so a
// rail's estimate can recover. idle_large_ops[rail] counts large operations since the rail last
// carried a share; only rails marked in `usable` (empty: all) are probed; `on_probe` (may be empty)
// is told of each probe.
void add_probe_shares(Plan& plan, const std::vector<RailEstimate>& est, size_t count,
                      size_t elem_size, std::vector<int>& idle_large_ops,
                      const std::vector<bool>& usable = {},
                      const std::function<void(int rail, size_t bytes)>& on_probe = {});

}  // namespace nezha::multirail
