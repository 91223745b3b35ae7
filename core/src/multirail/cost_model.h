// Per-rail cost model: the time one operation's share takes on a rail is alpha + bytes / beta
// (alpha: start-up cost, beta: bandwidth). The planner splits a fused buffer so every rail finishes
// together, so the model must be right where the traffic is, follow a real change (a `tc` rate change)
// within a handful of samples, and not be thrown off by one slow operation (a page fault, a GC pause,
// a retransmit).
//
// How it learns (choices, and why):
//  * Weighted least squares of seconds on bytes, from exponentially decayed sums (O(1) memory and
//    time per sample; the half-life is counted in samples because observe() carries no clock).
//  * Relative weighting (1 / t^2): timing noise is roughly proportional to the time, so a 64 MB
//    sample must not drown the 1 KB samples that pin alpha down.
//  * Outlier damping: a sample more than `outlier_ratio` off the prediction gets a weight that falls
//    with the fourth power of its log-error, so one stall barely moves the estimate.
//  * Change detection: `shift_run` samples in a row off by more than `shift_ratio` in the same
//    direction (a run broken only by a well-predicted sample of similar size) mean the rail really
//    changed; the old history is dropped and the fit restarts from those samples. This is what
//    makes a step change visible within ~3 large samples while the half-life stays long enough to
//    average noise.
//  * Identifiability: the intercept of the fit is only trusted when its standard error is small
//    (relative to alpha, or below an absolute floor). Otherwise (recent samples all near one size)
//    the parameter the data says nothing about is held at its current value and the other is
//    refit: for transfer-dominated samples alpha is held and beta = bytes / (t - alpha); for
//    latency-dominated samples beta is held and alpha = t - bytes / beta.
//  * Clamps: alpha >= 0, beta > 0. A rail that has only ever carried one size gets alpha = 0 and the
//    effective rate at that size, which predicts that size exactly; its alpha becomes trustworthy once
//    it also carries small messages (the engine's rail calibration sends a few sizes for this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nezha::multirail {

// What the planner (and the wire) know about one rail.
struct RailEstimate {
  double alpha_us = 0;   // start-up cost, microseconds
  double beta_gbps = 0;  // bandwidth, Gbit/s (1e9 bits per second); 0 while unknown
  uint64_t samples = 0;  // operations observed since construction or reset()
  // Start-up cost of a bandwidth-bound share, microseconds: the intercept of the fit over large
  // payloads only. A ring pays 2(n-1) steps where a latency-bound log-step pays log2(n), so at scale
  // this is far above alpha_us; 0 while the large payloads seen cannot separate it from bandwidth.
  double bulk_alpha_us = 0;
  // The mid band's own fit (payloads above kLatencyBoundBytes up to kMidBandMaxBytes, planner.h): what
  // halving/doubling costs there is neither the small payloads' latency nor the ring's start-up and
  // bandwidth (SplitRegimeModel). 0 while that band has not been measured (the planner then prices
  // it as bulk).
  double mid_alpha_us = 0;
  double mid_beta_gbps = 0;
  // Payloads below this run whole on one rail: striping them was measured slower on whole
  // operations (StripingCheck, striping_check.h; the rail table plans by the largest among the
  // usable rails). 0: no such floor. Not the cost model's: the rail table fills it in.
  uint64_t min_striped_bytes = 0;
  // Known once the model has enough samples to give a usable alpha and beta.
  bool known() const;
  bool mid_known() const { return mid_beta_gbps > 0; }
};

struct RailCostModelOptions {
  double half_life_samples = 32;  // weight of a sample halves after this many newer samples
  uint64_t min_samples = 3;       // estimate() stays unknown until this many samples
  double outlier_ratio = 1.5;     // t / predicted beyond this (either way): down-weighted
  double shift_ratio = 1.2;       // t / predicted beyond this, shift_run times in a row: a real change
  int shift_run = 3;
  double jump_ratio = 0;          // > 1: one sample off by more than this is a change at once (0: off)
  double alpha_rel_tolerance = 0.2;    // trust the fitted alpha if its std error <= this * alpha ...
  double alpha_abs_tolerance_us = 5;   // ... or <= this many microseconds
};

class RailCostModel {
 public:
  explicit RailCostModel(RailCostModelOptions opt = {});

  // One operation's share on this rail: `bytes` took `seconds`. Throws InvalidArgument for a negative
  // or non-finite time; a zero time (below clock resolution) is taken as 100 ns.
  void observe(size_t bytes, double seconds);
  RailEstimate estimate() const;
  // Predicted time for `bytes`; estimate() must be known() (InvalidArgument otherwise).
  double predict_seconds(size_t bytes) const;
  // Forget everything, e.g. after the rail went down (it may come back with different speed).
  void reset();
  // From now on alpha is `seconds` (>= 0) and only beta is fitted: for samples that come in one
  // size, which cannot tell a start-up from a rate, when a start-up is known from elsewhere (the
  // rail's small payloads). reset() frees it again.
  void anchor_alpha(double seconds);

 private:
  struct Sample {
    double bytes;
    double seconds;
  };
  struct Sums {  // decayed, weighted sums over (x = bytes, y = seconds)
    double w = 0, x = 0, y = 0, xx = 0, xy = 0;
    void add(double weight, double bx, double sy);
    void scale(double f);
  };

  bool has_fit() const { return slope_ > 0 && samples_ >= opt_.min_samples; }
  double predict(double bytes) const { return alpha_ + bytes * slope_; }
  // Counts `s` towards (or against) a run of surprising samples; true when the run says the rail
  // changed.
  bool track_surprise(const Sample& s, double log_ratio);
  void restart_from_run();
  void refit();

  RailCostModelOptions opt_;
  double decay_;  // per-sample weight multiplier, from half_life_samples
  Sums sums_;
  uint64_t samples_ = 0;
  // Current estimate, in seconds and seconds per byte (slope_ = 1 / beta in bytes/s; 0 = unknown).
  double alpha_ = 0;
  double slope_ = 0;
  double anchored_alpha_ = -1;  // seconds; < 0: alpha is fitted
  double rel_noise_var_;        // running mean of squared log-error of ordinary samples
  std::vector<Sample> run_;     // consecutive surprising samples, all in one direction
  int run_sign_ = 0;
};

}  // namespace nezha::multirail
