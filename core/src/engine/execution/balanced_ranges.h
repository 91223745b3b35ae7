// How the ranks of one rail agree on the ranges a balanced operation's part runs (share_balancer.h
// says why): shared by balanced allreduces (BalancedRange, allreduce_tasks.cc) and balanced
// striped broadcast, allgather, reducescatter and alltoall (StripedPart, striped_part_task.cc).
//
// A first run: the leader (one rank of the rail, or of the process set's view of it) takes the
// part's next range from the pool when its last range ended there, and sends {offset, count} to
// every other rank of the rail before the range runs; the others receive it; count 0 ends the part.
// The leader must be a rank whose range ends when the range has reached every rank: rank 0 in a
// ring (lock step) or a pairwise exchange; in a broadcast the chain's last rank (the root ends as
// soon as its sends sit in socket buffers, and would hand a slow rail ranges it has not carried).
// A redo (the part's rail failed): the leader sends the ranges it had handed the part, and every
// rank runs exactly those, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/deadline.h"
#include "engine/execution/share_balancer.h"
#include "transport/rail.h"

namespace nezha::engine {

// Runs `run` for each range of `part` on `rail`, as above (`leader`: that rank of `rail`).
// `waiting(true)` / `waiting(false)`, if given, bracket a rank's wait for the leader's next claim
// (a broadcast's root may wait there a long time while the chain's end catches up). `seq` numbers
// the operation on the rail; `total` bounds every range (elements of the plan); each message waits
// at most `timeout_s`.
void for_each_balanced_range(transport::PointToPointRail& rail, int leader, ShareBalancer& balancer, size_t part,
                             uint64_t seq, bool is_redo, size_t total, double timeout_s,
                             const std::function<void(const ShareBalancer::Range&)>& run,
                             const std::function<void(bool)>& waiting = {});

}  // namespace nezha::engine
