#include "multirail/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace nezha::multirail {

namespace {
constexpr double kMinSeconds = 1e-7;        // a zero-length timing is below clock resolution
constexpr double kInitialRelNoise = 0.1;    // assumed relative timing noise before any is measured
constexpr double kMinRelNoise = 0.01;       // never trust a fit as if timings were exact
constexpr double kBitsPerByte = 8;
}  // namespace

bool RailEstimate::known() const {
  return samples > 0 && std::isfinite(alpha_us) && alpha_us >= 0 && std::isfinite(beta_gbps) &&
         beta_gbps > 0;
}

void RailCostModel::Sums::add(double weight, double bx, double sy) {
  w += weight;
  x += weight * bx;
  y += weight * sy;
  xx += weight * bx * bx;
  xy += weight * bx * sy;
}

void RailCostModel::Sums::scale(double f) {
  w *= f;
  x *= f;
  y *= f;
  xx *= f;
  xy *= f;
}

RailCostModel::RailCostModel(RailCostModelOptions opt) : opt_(opt) {
  if (!(opt_.half_life_samples > 0) || !(opt_.outlier_ratio > 1) || !(opt_.shift_ratio > 1) ||
      opt_.shift_run < 1 || opt_.alpha_rel_tolerance < 0 || opt_.alpha_abs_tolerance_us < 0)
    throw InvalidArgument("RailCostModelOptions: half_life_samples must be > 0, outlier_ratio and "
                          "shift_ratio > 1, shift_run >= 1, tolerances >= 0");
  decay_ = std::pow(0.5, 1.0 / opt_.half_life_samples);
  reset();
}

void RailCostModel::reset() {
  sums_ = Sums{};
  samples_ = 0;
  alpha_ = 0;
  slope_ = 0;
  anchored_alpha_ = -1;
  rel_noise_var_ = kInitialRelNoise * kInitialRelNoise;
  run_.clear();
  run_sign_ = 0;
}

void RailCostModel::observe(size_t bytes, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw InvalidArgument("RailCostModel::observe: time for " + std::to_string(bytes) +
                          " bytes must be finite and >= 0, got " + std::to_string(seconds));
  const Sample s{static_cast<double>(bytes), std::max(seconds, kMinSeconds)};

  double weight = 1;
  // Weight by the predicted time when there is one: weighting by the observed time would bias the
  // fit towards samples that happened to be fast (they would weigh more).
  double t_ref = s.seconds;
  if (has_fit()) {
    t_ref = predict(s.bytes);
    const double log_ratio = std::log(s.seconds / t_ref);
    if (track_surprise(s, log_ratio)) {
      restart_from_run();
      ++samples_;
      refit();
      return;
    }
    const double limit = std::log(opt_.outlier_ratio);
    if (std::abs(log_ratio) > limit) {
      weight = std::pow(limit / std::abs(log_ratio), 4);
    } else {
      rel_noise_var_ += (1 - decay_) * (log_ratio * log_ratio - rel_noise_var_);
    }
  }
  sums_.scale(decay_);
  sums_.add(weight / (t_ref * t_ref), s.bytes, s.seconds);
  ++samples_;
  refit();
}

bool RailCostModel::track_surprise(const Sample& s, double log_ratio) {
  const double limit = std::log(opt_.shift_ratio);
  const int sign = log_ratio > limit ? 1 : (log_ratio < -limit ? -1 : 0);
  if (sign == 0) {
    // A well-predicted sample (hysteresis: within half the shift) of similar size contradicts the
    // run. One in between is noise on either reading, and one of very different size tests another
    // part of the curve (a latency-bound message while beta changed): neither breaks the run.
    if (!run_.empty() && std::abs(log_ratio) < limit / 2) {
      double lo = run_.front().bytes, hi = lo;
      for (const Sample& r : run_) {
        lo = std::min(lo, r.bytes);
        hi = std::max(hi, r.bytes);
      }
      if (s.bytes >= lo / 2 && s.bytes <= hi * 2) {
        run_.clear();
        run_sign_ = 0;
      }
    }
    return false;
  }
  if (sign != run_sign_) {
    run_.clear();
    run_sign_ = sign;
  }
  run_.push_back(s);
  // A sample off by more than jump_ratio is no noise on a large payload: a link was re-shaped,
  // congested or lost a path. Act on it at once instead of waiting for the run.
  const bool jump = opt_.jump_ratio > 0 && std::abs(log_ratio) > std::log(opt_.jump_ratio);
  return jump || static_cast<int>(run_.size()) >= opt_.shift_run;
}

void RailCostModel::restart_from_run() {
  // The history describes a rail that no longer exists; keep only the samples that showed the
  // change. alpha_ and slope_ stay as the values refit() holds fixed if the run cannot identify both.
  sums_ = Sums{};
  for (const Sample& r : run_) {
    sums_.scale(decay_);
    sums_.add(1 / (r.seconds * r.seconds), r.bytes, r.seconds);
  }
  run_.clear();
  run_sign_ = 0;
}

void RailCostModel::refit() {
  const Sums& s = sums_;
  if (!(s.w > 0)) return;

  if (anchored_alpha_ >= 0) {
    alpha_ = anchored_alpha_;
    double slope = (s.xy - alpha_ * s.x) / s.xx;
    if (!(slope > 0)) {  // the anchor alone exceeds these timings: through the origin instead
      alpha_ = 0;
      slope = s.xy / s.xx;
    }
    slope_ = slope;
    return;
  }

  // Full fit, if the samples span enough sizes to separate alpha from beta.
  const double det = s.w * s.xx - s.x * s.x;
  if (s.xx > 0 && det > 1e-9 * s.w * s.xx) {
    double slope = (s.w * s.xy - s.x * s.y) / det;
    double alpha = (s.y - slope * s.x) / s.w;
    const double noise_var = std::max(rel_noise_var_, kMinRelNoise * kMinRelNoise);
    const double alpha_stderr = std::sqrt(noise_var * s.xx / det);
    const double tolerance =
        std::max(opt_.alpha_rel_tolerance * std::abs(alpha), opt_.alpha_abs_tolerance_us * 1e-6);
    if (slope > 0 && alpha_stderr <= tolerance) {
      if (alpha < 0) {  // start-up cost cannot be negative: refit through the origin
        alpha = 0;
        slope = s.xy / s.xx;
      }
      alpha_ = alpha;
      slope_ = slope;
      return;
    }
  }

  // Not identifiable: hold the parameter these samples say little about, refit the other.
  const double mean_bytes = s.x / s.w;
  const bool latency_bound = slope_ > 0 && alpha_ > mean_bytes * slope_;
  if (latency_bound || !(s.xx > 0)) {
    alpha_ = std::max(0.0, (s.y - slope_ * s.x) / s.w);
    return;
  }
  double slope = (s.xy - alpha_ * s.x) / s.xx;
  if (!(slope > 0)) {
    // The held alpha alone exceeds these timings, so it was wrong; fall back to alpha = 0.
    alpha_ = 0;
    slope = s.xy / s.xx;
  }
  slope_ = slope;
}

void RailCostModel::anchor_alpha(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw InvalidArgument("RailCostModel::anchor_alpha: " + std::to_string(seconds) + " s");
  anchored_alpha_ = seconds;
}

RailEstimate RailCostModel::estimate() const {
  RailEstimate e;
  e.samples = samples_;
  if (has_fit()) {
    e.alpha_us = alpha_ * 1e6;
    e.beta_gbps = kBitsPerByte / slope_ / 1e9;
  }
  return e;
}

double RailCostModel::predict_seconds(size_t bytes) const {
  if (!has_fit())
    throw InvalidArgument("RailCostModel::predict_seconds: no estimate yet (" +
                          std::to_string(samples_) + " samples, need " +
                          std::to_string(opt_.min_samples) + ")");
  return predict(static_cast<double>(bytes));
}

}  // namespace nezha::multirail
