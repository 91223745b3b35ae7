// Rank 0's side of rail failover and re-admission (pure: no sockets, no threads, time passed in).
//
// The protocol, in the order its messages travel (RailEvent in rail_event.h):
//  1. A rank sees a share fail on rail r, or r go silent while busy (RailWatchdog), and reports
//     kFailed. For an error, rank 0 marks r down at once (later plans leave it out) and broadcasts
//     kDown in the ordered response stream. A stall is first checked with every rank (kQuery /
//     kQueryReply): if some rank has not reached the stalled operation yet, the silence is that
//     rank being late (a busy or starved process), not the rail, and nothing happens (the reporter
//     reports again if the silence goes on). Otherwise kDown as for an error.
//  2. Every rank, at kDown, aborts r (so shares blocked on it fail at once), lets r's worker drain,
//     and reports kDrained with how far it got on r (1 + seq of its last completed operation).
//  3. With every report in, rank 0 broadcasts kRedo{r, first = min over ranks, target rail}: every
//     rank reruns the shares of r with seq >= first on the target, from the input copies it kept.
//     The minimum is the first share some rank has not completed; below it every rank is done.
//  4. After a back-off (RailHealth) rank 0 broadcasts kProbe: every rank resets r's connections and
//     says kProbeReady; then kConnect: every rank reconnects and runs a test allreduce and reports
//     kProbeResult. All good: kUp, and r is planned again (its share follows the cost model). Any
//     failure: kProbeFailed (every rank aborts r again) and a longer back-off if the rail flaps.
// Events from rank 0 travel with the responses, so every rank applies them at the same point of its
// operation sequence: the redo shares land in the same place of the target rail's queue everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/rail_event.h"
#include "multirail/cost_model.h"
#include "multirail/rail_health.h"

namespace nezha::engine {

class RailFailover {
 public:
  RailFailover(int size, std::vector<std::string> rail_names, multirail::RailHealthOptions opt = {});

  struct Decision {
    std::vector<RailEvent> broadcast;  // to every rank, rank 0 included, in this order
    std::string fatal;                 // non-empty: the job cannot go on
  };

  // `stalled`: the rail went silent (RailWatchdog) in operation `seq` rather than failing with an
  // error. A stall of the last usable rail is ignored: it may be the echo of another rail's failure
  // on a slow rank. A stall in an earlier operation than the one being checked restarts the check
  // there: after a cut, the rank beside the cut can be done with operation N (its last bytes sat in
  // its socket buffer) and stall in N+1 while its neighbour stalls in N; checking N+1 finds the
  // neighbour "behind" and would cancel, and the report of N, dropped while N+1 was checked, would
  // come back only several limits later.
  Decision on_failed(int rail, int rank, const std::string& why, bool stalled, uint64_t seq,
                     Clock::time_point now);
  // The rank's answer to the check of the stall in operation `seq`; `behind`: it has not reached
  // that operation. Answers to an earlier check (superseded, see on_failed) are ignored.
  Decision on_query_reply(int rail, int rank, uint64_t seq, bool behind, Clock::time_point now);
  Decision on_drained(int rail, int rank, uint64_t completed,
                      const std::vector<multirail::RailEstimate>& estimates);
  // Rails a failed rail's work may be redone on (default: all). A collective rail is not one:
  // the lost work may hold operations it cannot run.
  void set_redo_targets(std::vector<bool> allowed) { redo_targets_ = std::move(allowed); }
  Decision on_probe_ready(int rail, int rank);
  Decision on_probe_result(int rail, int rank, bool ok, const std::string& why, Clock::time_point now);
  Decision start_due_probes(Clock::time_point now);
  std::optional<Clock::time_point> next_wakeup() const;

  std::vector<bool> usable() const;  // rails that carry traffic
  int num_usable() const;
  const std::string& name(int rail) const { return rails_[rail].name; }

 private:
  enum class Phase { kUp, kDraining, kDown, kResetting, kConnecting };
  struct Rail {
    Rail(std::string n, multirail::RailHealth h) : name(std::move(n)), health(std::move(h)) {}
    std::string name;
    multirail::RailHealth health;
    Phase phase = Phase::kUp;
    std::vector<bool> reported;  // per rank, for the phase's collection
    uint64_t first_incomplete = 0;
    bool querying = false;  // kUp: a stall report is being checked with every rank
    uint64_t query_seq = 0;  // the operation being checked
    std::string query_why;  // the report being checked ("failed on rank R: ...")
  };
  bool collect(Rail& rail, int rank);  // true once every rank has reported
  void start_collecting(Rail& rail);
  void check(int rail, int rank) const;
  Decision take_down(int rail, const std::string& why, Clock::time_point now);

  int size_;
  std::vector<Rail> rails_;
  std::vector<bool> redo_targets_;  // set_redo_targets(); empty: every rail
};

}  // namespace nezha::engine
