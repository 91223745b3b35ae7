// Whether failover can save anything in a job: which rails' shares a redo on another rail could
// rescue, decided from what each rail says of itself (RailProperties::can_fail_alone, and its kind:
// Rail::as_point_to_point()).
//
// A redo needs a rail that survives the failure. A rail that cannot fail alone (shared memory)
// fails only when a rank dies, and that takes every rail down with it: its shares are never worth
// a kept input. A rail that can fail alone (a socket, a NIC, a daemon) is worth one only where
// another rail could redo its work (a point-to-point rail: a collective rail redoes nothing).
// Where no rail is worth one, the job runs as a one-rail job does: no input copies, no ledger, no
// watchdog, and a rail's failure fails its operations naming the rail and the peer.
#pragma once

#include <vector>

namespace nezha::engine {

// What the decision reads of one rail.
struct RedoRail {
  bool can_fail_alone = true;  // transport::RailProperties::can_fail_alone
  bool point_to_point = true;  // transport::Rail::as_point_to_point() != nullptr: it can redo work
};

// Per rail: true when a failure of that rail could be redone on another rail of `rails`.
std::vector<bool> redo_can_save(const std::vector<RedoRail>& rails);

// True when some rail's shares could be redone (failover is worth its per-operation cost).
bool failover_can_help(const std::vector<RedoRail>& rails);

}  // namespace nezha::engine
