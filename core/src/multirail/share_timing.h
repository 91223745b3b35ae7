// What a rail is answerable for in the time one share took.
//
// A share's wall time on a rank runs from when this rank started it to when its result was complete.
// On a starved host (ranks computing their backward pass on fewer cores than ranks) that time is
// often mostly waiting: a peer's rail worker was not scheduled yet, or was descheduled mid-share, and
// this rank sat in a send or receive until the peer came. Fed to the cost model as it is, such waits
// become start-up cost (a small share that waited 30 ms) or, in the fits over large payloads, a fixed
// cost whose slope is then read as an enormous bandwidth; the planner then puts a whole payload on
// one rail of two equal ones.
//
// The rail's own part is estimated from the share's receiving calls (each blocking receive or
// exchange of the algorithm, timed by the engine; sends into a socket buffer return at once and say
// nothing about the rail). In a ring or log-step allreduce a rank waits for a late peer at the first
// call that needs data that went through that peer; from there the messages flow. So a few calls
// of a share wait, the others take what the rail takes; the reference is the share's upper-quartile
// call (not the median: in a pipelined ring calls alternate between send-bound and receive-bound, a
// factor 3 apart on a paced link; with two calls, the faster). A call that took more than
// kPeerWaitRatio times the reference, and kMinPeerWaitSeconds more, waited for a peer, and its
// excess over the reference is taken out of the share's time (every such call's: correcting one
// wait of two would leave samples of one rail inconsistent with each other, which misleads the fit
// more than leaving both). A rail that is slow for the whole share keeps its time (every call is
// slow); jitter below the ratio is kept, so the estimate is not biased low by timing noise; and so
// are waits shorter than a scheduler's time slice, which cannot be told from a network hop's latency
// (a message that was already buffered returns in microseconds, one that crossed the network in tens
// of them).
//
// What a share with waits taken out may claim is bounded below by what the rail is known to take
// for its bytes (`floor_seconds`: this rank's model's prediction). Where the ranks starve for CPU
// (16 testbed hosts training on 2 cores) a peer runs in bursts: most calls find their data already
// buffered and return in microseconds, the few that waited carry the transfer too, and taking
// their excess out left 0.3-1 ms of shares that took 80-270 ms, 5-8 Gbit/s on a 0.25 Gbit/s rail;
// three of those in a row reset a cost model to them, and the next plan put 71 % of 100 MB on that
// rail. A share with waits is evidence of the waits, not of the rail's speed; one without keeps
// its own time, so a rail that did get faster is still seen.
//
// Not covered: a share of one data call (nothing to compare it with), waits at more than a quarter
// of a share's calls (the reference is then a wait itself), and shares whose algorithm the engine
// does not time call by call (a collective rail, the hierarchical allreduce) or does not correct
// (calibration): those report their wall time.
#pragma once

#include <vector>

namespace nezha::multirail {

// A call waited for a peer when it took this many times the share's upper-quartile call, and this
// many seconds more.
constexpr double kPeerWaitRatio = 2.0;
constexpr double kMinPeerWaitSeconds = 500e-6;

// The seconds of a share of `total_seconds` that the rail is answerable for, given the durations of
// its data calls (any order; empty: total_seconds) and, where waits are taken out, no less than
// `floor_seconds` (0: no bound). Never negative, never above total_seconds.
double rail_share_seconds(double total_seconds, const std::vector<double>& call_seconds,
                          double floor_seconds = 0);

}  // namespace nezha::multirail
