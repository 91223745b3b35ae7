// Whether striping a small or mid-size allreduce has paid off, measured on whole operations.
//
// The cost models price each rail's share from what that rail is answerable for (share_timing.h),
// and the planner stripes where those prices say it saves time. What they cannot see is what a
// striped operation costs the host beyond its shares: one more thread per rail to wake on every
// rank, and the caller woken after them. Where ranks outnumber cores that is a scheduling delay per
// rail per step; on the testbed's 16 hosts on 2 cores a 32 KB allreduce striped over two rails took
// 2.3 ms where one rail alone took 1.5 ms, while the models predicted striping faster
// (benchmarks/SCALE.md). For payloads of a few hundred KiB and less, where that cost is of the
// order of the operation, this check compares the two on the operations themselves: per size class
// (powers of two), the recent times of the striped ones against the whole ones. Where striping was
// more than kCheckLossMargin slower, payloads up to that class run whole
// (min_striped_bytes); the rail table plans a few of them the other way now and then
// (check_explores) so that both stay measured and a change either way is seen.
//
// Whose times: every rank's. An operation lasts until its last rank has its result, and no rank
// sees that alone: rank 0 sends the response before it starts its own shares, so its peers start
// first and it often finishes first, while a peer waits for data rank 0's shaped link still queues
// (4 testbed hosts, a 32 KB allreduce whole on one rail: rank 0's own time 76 us, first start to
// last end 487 us). So every rank times its own operations (from its shares being posted to its
// result) and sends them to rank 0 with its next request list or cache-round vector, and a class's
// verdict compares the slowest rank's median each way.
//
// Why per class and not one correction: the models' error differs by size (a share's time is
// priced with a start-up learned from other sizes), and the same op stream of a job comes back to
// the same sizes, so within a class both ways are measured on comparable payloads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nezha::multirail {

// Payloads above kCheckMinBytes up to kMidBandMaxBytes (planner.h) are checked, in classes
// (2^(11+k), 2^(12+k)] for k = 0 .. kCheckClasses - 1: 2-4 KiB ... 128-256 KiB.
constexpr size_t kCheckMinBytes = size_t{2} << 10;
constexpr int kCheckClasses = 7;
// A class's verdict needs this many operations each way, from the last kCheckWindow.
constexpr int kCheckMinSamples = 5;
constexpr int kCheckWindow = 9;
// Striping loses a class when its median is this much above the whole operations': beyond the
// medians' run-to-run spread, so a class whose two ways cost about the same keeps the models' plan
// instead of switching whenever its medians cross.
constexpr double kCheckLossMargin = 0.10;
// Contested plans (the models would stripe them) of a class are made the other way in runs of
// kCheckExploreRun: the last run of every kCheckExplorePeriod plans, of every kCheckEarlyPeriod
// among the first kCheckEarlyPlans (so a job of a few hundred operations gets a verdict within
// its first fifty or so). Runs, because an operation right after one of the other kind is not what
// a run of its kind costs: a rail idle for a while starts cold (its worker asleep, its connections'
// congestion windows restarted), and a shaped link rested by a striped operation lets a whole one
// through at its burst rate (4 testbed hosts: lone 64 KB allreduces whole on rail 0 took 0.86-0.91
// ms, a stream of them 1.10); so a rank does not count an operation that follows one of the other
// kind in its class.
// A count of plans, not of samples: cache rounds plan on every rank, and only the plans' order is
// the same everywhere.
constexpr int kCheckExploreRun = 4;
constexpr int kCheckExplorePeriod = 64;
constexpr int kCheckEarlyPeriod = 16;
constexpr int kCheckEarlyPlans = 64;
// Whether the n-th (from 1) contested plan of a class is made the other way.
bool check_explores(uint64_t n);

// The class of a payload of `bytes`, or -1 when it is not checked.
int check_class(size_t bytes);

// Operation times a rank keeps for its next message to rank 0 (the latest: a rank that sends none
// for a while does not grow its outbox), and the most one message may carry.
constexpr size_t kMaxReportedOperations = 256;

// One allreduce's time on one rank, as it travels to rank 0.
struct OperationTime {
  uint32_t bytes = 0;  // a checked size (check_class >= 0)
  bool striped = false;
  float seconds = 0;
};

// One rank's recent operation times per class, each way. Not thread-safe: the rail table calls it
// under its lock.
class StripingCheck {
 public:
  // An allreduce of `bytes` (this rank's payload) took `seconds` from its shares being posted to
  // its result, striped over several rails or whole on one. Sizes not checked are ignored.
  void observe(size_t bytes, bool striped, double seconds);
  // The median of the class's last kCheckWindow operations one way, or 0 while it has fewer than
  // kCheckMinSamples.
  double median_seconds(int cls, bool striped) const;

 private:
  struct Recent {
    double seconds[kCheckWindow] = {};
    int count = 0;      // samples held, up to kCheckWindow
    int next = 0;       // where the next one goes
    double median = 0;  // of the samples held; 0 with fewer than kCheckMinSamples
    void add(double s);
  };
  Recent striped_[kCheckClasses];
  Recent whole_[kCheckClasses];
};

// Payloads below this should run whole: one more than the largest class where striping was measured
// more than kCheckLossMargin slower, comparing the slowest rank's median each way (ranks without kCheckMinSamples one way
// do not count for it); 0 when there is none.
uint64_t min_striped_bytes(const std::vector<StripingCheck>& ranks);

}  // namespace nezha::multirail
