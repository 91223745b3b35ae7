// ShareBalancer: re-splits one striped operation among its rails while it runs (an allreduce's
// element ranges; for the other collectives, ranges of the plan that carry that proportion of every
// block: striped_part_task.cc).
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
// runs: balanced_ranges.cc). The other ranks follow what the leader sent. Ranks run their ring for
// a range in lock step, so the leader's view of each rail's progress is everyone's, within a step.
//
// Who takes what. The pool starts as the plan's shares. A rail takes from the front of its own share
// half of what is left there (at least its minimum, and all of it once less than twice that is
// left), so its first range is large (one ring for most of the data) and its ranges shrink as its
// share drains. A rail whose own share is drained takes from the back of the share with the most
// time left (elements left / planned share) the part it would carry while that share's rail carries
// the rest: a fraction r_thief / (r_thief + r_victim) of it (at least its minimum, all of it below
// twice that), r being each rail's rate in this operation so far (elements of its finished ranges
// over the time since its first claim; the leader claims a rail's next range when its last one
// ended), or the plan's share sizes while a rail has no finished range to measure. A rail that slows
// down therefore has little committed ahead of it, and the operation ends within about one minimum
// range of the last byte, not when the slowest fixed share ends. Stealing by rate, not by halves:
// a slow rail done with its share first would otherwise take half of a fast rail's rest and end
// last.
//
// Minimum ranges last about as long on every rail: min_claim is the largest share's, a smaller
// share's is scaled down with it (never below floor_claim). With one minimum for all, a slow rail's
// last ranges would run long after a fast rail beside it had nothing left.
//
// The tail. Whichever rail ends first idles until the last range on another rail ends, so the
// operation's last ranges bound its imbalance. Once a share has less than two minimum ranges left
// (and for every steal), ranges may shrink down to the tail minimum (tail_claim, scaled per share
// as min_claim is): a few more small ranges at the very end, each costing one more claim message and
// algorithm start-up, against a rail idling for up to a whole minimum range. tail_claim = min_claim
// keeps every range at its minimum (what a paced alltoall needs).
//
// Failover. Every range taken is recorded per part (plan share); a part lost with its rail is redone
// on a surviving rail from the leader's record (claimed()), which it sends before the redo runs, so
// ranks that had not heard of a range the leader handed out redo it too.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <vector>

#include "multirail/planner.h"

namespace nezha::engine {

// An operation is balanced only from this many minimum ranges up: below, the claims' messages and
// the rings' restarts cost more than an imbalance can.
constexpr size_t kBalanceMinRanges = 4;
// A slower rail's minimum range is at most this many times smaller than the largest share's: the
// claims' messages and the rings' restarts must stay small beside what a range carries.
constexpr size_t kMinClaimSpread = 8;

// An allreduce's tail minimum is its agreed minimum range divided by this, raised as the minimum is
// (leader_min_range_bytes): on hundreds of ranks a smaller range would spend more time in its
// algorithm's start-up than the idle tail it saves.
constexpr size_t kTailClaimSpread = 4;

// The smallest range the balancing leader hands out: `agreed_min` (what the decision to balance
// was made by, the same on every rank), raised so each range's bulk start-up on the largest share's
// rail stays small (multirail::amortized_range_bytes): every range runs that rail's algorithm from
// its first step, and on hundreds of ranks a ring's 2(n-1) steps outlast a small range's bytes.
size_t leader_min_range_bytes(const std::vector<multirail::RailShare>& plan,
                              const std::vector<multirail::RailEstimate>& estimates, size_t agreed_min);

class ShareBalancer {
 public:
  struct Range {
    size_t offset = 0;  // elements, from the start of the operation's buffer
    size_t count = 0;   // 0: nothing left
  };

  // `plan`: the operation's shares (one part each, in this order). `min_claim`, `align`,
  // `floor_claim` and `tail_claim`, in elements: the largest share's rail takes ranges of at least
  // min_claim (at least tail_claim at the end, and a share's last piece may be smaller), a rail with
  // a share s times as large at least s x min_claim (s x tail_claim) but never below floor_claim;
  // ranges start at a multiple of `align` from their share's start where they can. tail_claim 0:
  // min_claim (no smaller ranges at the end).
  ShareBalancer(const std::vector<multirail::RailShare>& plan, size_t min_claim, size_t align,
                size_t floor_claim = 0, size_t tail_claim = 0);

  // Leader only: the next range for `part`'s rail, asked for at `now` (thread-safe; rails ask
  // concurrently).
  Range claim(size_t part, std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  // Every range claim(part) has returned, in order (the leader's record, for a redo).
  std::vector<Range> claimed(size_t part) const;
  size_t parts() const { return pools_.size(); }

 private:
  struct Pool {
    size_t begin, end;  // elements not taken yet from one share: [begin, end)
  };
  // What a rail with minimum `min` takes from the front of its own share when `left` elements are
  // left there: half (aligned, at least min), or all of them once fewer than 2 x min are left.
  size_t half_of_own(size_t left, size_t min) const;
  size_t round_up(size_t n) const { return (n + align_ - 1) / align_ * align_; }

  mutable std::mutex mu_;
  std::vector<Pool> pools_;
  std::vector<std::vector<Range>> claims_;
  struct Progress {  // of one part, for its rate
    std::chrono::steady_clock::time_point first, last;  // its first and latest claim
    size_t finished = 0;  // elements of its ranges before the latest (ended when it claimed that)
    size_t claimed = 0;   // elements of all its ranges
    int claims = 0;
  };
  // Elements per second of `part` so far (ranges ended by `at`), 0 if not measurable yet.
  double rate(size_t part, size_t finished, std::chrono::steady_clock::time_point at) const;

  std::vector<Progress> progress_;
  std::vector<double> weights_;   // each part's planned share, elements
  std::vector<size_t> min_claim_;  // each part's minimum range, elements
  std::vector<size_t> tail_claim_;  // each part's minimum range at the end (<= min_claim_), elements
  size_t align_;
};

}  // namespace nezha::engine
