// ShareBalancer: re-splits one striped operation among its rails while it runs (an allreduce's
// element ranges; for the other collectives, ranges of the plan that carry that proportion of every
// block: executor_striped.cc).
//
// Why. The plan fixes each rail's share from the cost model before the operation starts; the
// operation then lasts as long as its slowest share, so a misjudged split (a 48/52 split of equal
// rails costs 4 %) or a rail whose rate changes mid-operation (a throttled link, a neighbour's
// traffic) holds every rank up while the other rails idle.
//
// How ranks agree. Every rank must run the same element ranges on the same rails in the same order:
// only then do the rings pair up and is the result bit-identical everywhere. So one rank decides:
// one rank (the leader: the operation's rank 0, a broadcast chain's last rank; balanced_ranges.h) keeps the pool of ranges no rail has started, and a rail's
// worker there takes its next range from the pool when its previous range is done and sends it to
// the other ranks of that rail (one small message per range, over the rail itself, before the range
// runs: executor_balanced.cc). The other ranks follow what the leader sent. Ranks run their ring for
// a range in lock step, so the leader's view of each rail's progress is everyone's, within a step.
//
// Who takes what. The pool starts as the plan's shares. A rail takes from the front of its own share
// half of what is left there (at least min_claim elements, and all of it once less than twice that
// is left), so its first range is large (one ring for most of the data) and its ranges shrink as its
// share drains. A rail whose own share is drained takes the back half (same rule) of the largest
// share left on another rail. A rail that slows down therefore has little committed ahead of it, and
// the operation ends within about one min_claim range of the last byte, not when the slowest fixed
// share ends.
//
// Failover. Every range taken is recorded per part (plan share); a part lost with its rail is redone
// on a surviving rail from the leader's record (claimed()), which it sends before the redo runs, so
// ranks that had not heard of a range the leader handed out redo it too.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "multirail/planner.h"

namespace nezha::engine {

// An operation is balanced only from this many minimum ranges up: below, the claims' messages and
// the rings' restarts cost more than an imbalance can.
constexpr size_t kBalanceMinRanges = 4;

class ShareBalancer {
 public:
  struct Range {
    size_t offset = 0;  // elements, from the start of the operation's buffer
    size_t count = 0;   // 0: nothing left
  };

  // `plan`: the operation's shares (one part each, in this order). `min_claim` and `align`, in
  // elements: ranges are at least min_claim long (except a share's last piece) and start at a
  // multiple of `align` from their share's start where they can.
  ShareBalancer(const std::vector<multirail::RailShare>& plan, size_t min_claim, size_t align);

  // Leader only: the next range for `part`'s rail (thread-safe; rails ask concurrently).
  Range claim(size_t part);
  // Every range claim(part) has returned, in order (the leader's record, for a redo).
  std::vector<Range> claimed(size_t part) const;
  size_t parts() const { return pools_.size(); }

 private:
  struct Pool {
    size_t begin, end;  // elements not taken yet from one share: [begin, end)
  };
  size_t take_size(size_t left) const;

  mutable std::mutex mu_;
  std::vector<Pool> pools_;
  std::vector<std::vector<Range>> claims_;
  size_t min_claim_;
  size_t align_;
};

}  // namespace nezha::engine
