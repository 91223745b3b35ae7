#include "multirail/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/error.h"

namespace nezha::multirail {

namespace {

// A usable, known rail in SI units.
struct Lane {
  int rail;
  double alpha_s;    // start-up of a bandwidth-bound share, seconds (what striping pays per rail)
  double latency_s;  // start-up of a latency-bound payload, seconds
  double beta_Bps;   // bytes per second
};

Lane to_lane(int rail, const RailEstimate& e) {
  // The small-payload time is a floor on any share's start-up: a fit over large payloads whose
  // intercept comes out lower (a token bucket's burst, or one it cannot separate: 0) must not make
  // striping look cheaper than the rail's measured latency.
  return Lane{rail, std::max(e.alpha_us, e.bulk_alpha_us) * 1e-6, e.alpha_us * 1e-6,
              e.beta_gbps * 1e9 / 8};
}

bool latency_bound(double bytes) { return bytes < static_cast<double>(kLatencyBoundBytes); }

// Time of the whole payload on one lane, priced as latency-bound or not.
double single_time(const Lane& l, double bytes, bool latency_priced) {
  return (latency_priced ? l.latency_s : l.alpha_s) + bytes / l.beta_Bps;
}

// Usable, known rails sorted by alpha (ties: lower index first, so the order is deterministic).
std::vector<Lane> known_lanes(const std::vector<RailEstimate>& rails,
                              const std::vector<bool>& usable) {
  std::vector<Lane> lanes;
  for (size_t i = 0; i < rails.size() && i < usable.size(); ++i)
    if (usable[i] && rails[i].known()) lanes.push_back(to_lane(static_cast<int>(i), rails[i]));
  std::stable_sort(lanes.begin(), lanes.end(),
                   [](const Lane& a, const Lane& b) { return a.alpha_s < b.alpha_s; });
  return lanes;
}

// Water level: the common finish time T when `bytes` are shared so that all rails with alpha < T
// finish together. `active` receives how many lanes (a prefix of the alpha-sorted list) take part.
double water_level(const std::vector<Lane>& lanes, double bytes, size_t* active = nullptr) {
  double sum_beta = 0, sum_alpha_beta = 0, level = 0;
  for (size_t k = 0; k < lanes.size(); ++k) {
    sum_beta += lanes[k].beta_Bps;
    sum_alpha_beta += lanes[k].alpha_s * lanes[k].beta_Bps;
    level = (bytes + sum_alpha_beta) / sum_beta;
    if (k + 1 == lanes.size() || level <= lanes[k + 1].alpha_s) {
      if (active) *active = k + 1;
      return level;
    }
  }
  return level;  // not reached: lanes is never empty here
}

double best_single_time(const std::vector<Lane>& lanes, double bytes, bool latency_priced) {
  double best = std::numeric_limits<double>::infinity();
  for (const Lane& l : lanes) best = std::min(best, single_time(l, bytes, latency_priced));
  return best;
}

// >= 0 where striping saves at least kMinStripingGain over the best single rail. The single-rail
// price jumps at kLatencyBoundBytes, so a caller evaluating a segment's end names its pricing.
double striping_margin(const std::vector<Lane>& lanes, double bytes, bool latency_priced) {
  return (1 - kMinStripingGain) * best_single_time(lanes, bytes, latency_priced) -
         water_level(lanes, bytes);
}

size_t ceil_to_size(double bytes) {
  const double c = std::ceil(bytes);
  if (!(c < 0x1p63)) return SIZE_MAX;
  return static_cast<size_t>(std::max(c, 0.0));
}

// A usable, known rail priced by its mid-band fit.
Lane to_mid_lane(int rail, const RailEstimate& e) {
  return Lane{rail, e.mid_alpha_us * 1e-6, e.mid_alpha_us * 1e-6, e.mid_beta_gbps * 1e9 / 8};
}

// Every usable, known rail's two prices for a share of a mid-band payload: `mid` for a share above
// kLatencyBoundBytes (its mid-band fit, or its bulk price while it has none: it gets one once it
// carries a share there), `small` for a share that would run the log-step (its latency price).
// Empty when no rail has a mid-band fit (the bulk prices then plan the payload whole).
struct MidBandLanes {
  std::vector<Lane> mid, small;
};

MidBandLanes mid_band_lanes(const std::vector<RailEstimate>& rails, const std::vector<bool>& usable) {
  MidBandLanes out;
  bool any_fit = false;
  for (size_t i = 0; i < rails.size() && i < usable.size(); ++i) {
    if (!usable[i] || !rails[i].known()) continue;
    any_fit |= rails[i].mid_known();
    const Lane bulk = to_lane(static_cast<int>(i), rails[i]);
    out.mid.push_back(rails[i].mid_known() ? to_mid_lane(static_cast<int>(i), rails[i]) : bulk);
    out.small.push_back(Lane{bulk.rail, bulk.latency_s, bulk.latency_s, bulk.beta_Bps});
  }
  if (!any_fit) return {};
  return out;
}

}  // namespace

bool in_mid_band(size_t bytes) { return bytes > kLatencyBoundBytes && bytes <= kMidBandMaxBytes; }

double predicted_seconds(const RailEstimate& rail, size_t bytes) {
  if (!rail.known()) throw InvalidArgument("predicted_seconds: the rail has no estimate yet");
  const double b = static_cast<double>(bytes);
  if (in_mid_band(bytes) && rail.mid_known()) return single_time(to_mid_lane(0, rail), b, false);
  return single_time(to_lane(0, rail), b, latency_bound(b));
}

size_t amortized_range_bytes(const RailEstimate& rail) {
  if (!rail.known()) return 0;
  return ceil_to_size(kRangeAmortization * rail.bulk_alpha_us * 1e-6 * rail.beta_gbps * 1e9 / 8);
}

size_t striping_threshold_bytes(const std::vector<RailEstimate>& rails,
                                const std::vector<bool>& usable) {
  const std::vector<Lane> lanes = known_lanes(rails, usable);
  if (lanes.size() < 2) return SIZE_MAX;

  // Both the striped time and the best single-rail time are piecewise linear in the payload; between
  // consecutive breakpoints the margin is linear, so the first crossing is found exactly.
  std::vector<double> points{0.0};
  for (size_t k = 1; k < lanes.size(); ++k) {  // water level reaches lane k's alpha
    double p = 0;
    for (size_t i = 0; i < k; ++i) p += (lanes[k].alpha_s - lanes[i].alpha_s) * lanes[i].beta_Bps;
    points.push_back(p);
  }
  points.push_back(static_cast<double>(kLatencyBoundBytes));  // single rails switch algorithm
  for (size_t i = 0; i < lanes.size(); ++i) {  // the best single rail changes (either price)
    for (size_t j = i + 1; j < lanes.size(); ++j) {
      const double inv_diff = 1 / lanes[i].beta_Bps - 1 / lanes[j].beta_Bps;
      if (inv_diff == 0) continue;
      for (double p : {(lanes[j].alpha_s - lanes[i].alpha_s) / inv_diff,
                       (lanes[j].latency_s - lanes[i].latency_s) / inv_diff})
        if (p > 0 && std::isfinite(p)) points.push_back(p);
    }
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());

  for (size_t s = 0; s < points.size(); ++s) {
    const double lo = points[s];
    // The last segment is unbounded; it is still linear, so any second point gives its slope.
    const double hi = s + 1 < points.size() ? points[s + 1] : lo + std::max(lo, 1.0);
    const bool priced = latency_bound(lo);  // one pricing over [lo, hi): hi <= the price jump
    const double f_lo = striping_margin(lanes, lo, priced);
    if (f_lo >= 0) return ceil_to_size(lo);
    const double f_hi = striping_margin(lanes, hi, priced);
    if (f_hi > f_lo && (f_hi >= 0 || s + 1 == points.size()))
      return ceil_to_size(lo + (hi - lo) * (-f_lo) / (f_hi - f_lo));
  }
  return SIZE_MAX;
}

namespace {

Plan whole_on(int rail, size_t count, std::string why) {
  Plan plan;
  plan.shares.push_back(RailShare{rail, 0, count});
  plan.striped = false;
  plan.why = std::move(why);
  return plan;
}

// Shares of `count` elements in whole alignment units: `held` units on the rails it names (by rail
// index; empty: none), the rest water-filled over the first `active` lanes.
Plan water_fill(const std::vector<Lane>& lanes, size_t active, double level, size_t count,
                size_t elem_size, size_t unit_elems, size_t n_rails,
                const std::vector<size_t>& held = {}) {
  const size_t unit_bytes = unit_elems * elem_size;
  const size_t held_units = std::accumulate(held.begin(), held.end(), size_t{0});
  const size_t total_units = count / unit_elems - held_units;
  const size_t tail = count % unit_elems;

  std::vector<size_t> units(n_rails, 0);
  size_t assigned = 0;
  size_t fastest = 0;  // among the active lanes: highest beta, then lowest rail index
  for (size_t k = 0; k < active; ++k) {
    const Lane& l = lanes[k];
    const double share_units = std::max(0.0, (level - l.alpha_s) * l.beta_Bps) / unit_bytes;
    const size_t u = std::min(static_cast<size_t>(std::floor(share_units)), total_units);
    units[l.rail] = u;
    assigned += u;
    const Lane& f = lanes[fastest];
    if (l.beta_Bps > f.beta_Bps || (l.beta_Bps == f.beta_Bps && l.rail < f.rail)) fastest = k;
  }
  const int fastest_rail = lanes[fastest].rail;
  // Rounding down leaves a few units over; floating-point error may (rarely) overshoot by one.
  if (assigned <= total_units) {
    units[fastest_rail] += total_units - assigned;
  } else {
    size_t excess = assigned - total_units;
    for (size_t k = 0; k < active && excess > 0; ++k) {
      size_t& u = units[lanes[k].rail];
      const size_t take = std::min(u, excess);
      u -= take;
      excess -= take;
    }
  }

  std::vector<size_t> counts(n_rails, 0);
  int last_rail = -1;
  for (size_t r = 0; r < n_rails; ++r) {
    if (r < held.size()) units[r] += held[r];
    counts[r] = units[r] * unit_elems;
    if (counts[r] > 0) last_rail = static_cast<int>(r);
  }
  // The tail shorter than one alignment unit goes last, so every share starts aligned.
  counts[last_rail >= 0 ? last_rail : fastest_rail] += tail;

  Plan plan;
  size_t offset = 0;
  for (size_t r = 0; r < n_rails; ++r) {
    if (counts[r] == 0) continue;
    plan.shares.push_back(RailShare{static_cast<int>(r), offset, counts[r]});
    offset += counts[r];
  }
  plan.striped = plan.shares.size() > 1;
  return plan;
}

// A mid-band payload (planner.h: Mid band). Water filling starts from every rail's mid price and
// re-prices a rail by the band its share falls in until every share is priced by its own band. A
// rail that would cross the boundary again (its mid price gives it no more than kLatencyBoundBytes,
// its latency price more) is held at the boundary, the largest share the log-step runs, and the
// other rails share the rest: dropping it instead ended striping where the rails are alike (two
// equal rails, 128 KB on 6 hosts: both shares at the boundary). Each rail moves once and is held at
// most once, and a lone rail left to carry the rest takes the band of the rest once, so this ends
// within 2n + 2 rounds.
Plan plan_mid_band(const MidBandLanes& prices, const PlanRequest& req, size_t bytes) {
  const double b = static_cast<double>(bytes);
  size_t best = 0;
  for (size_t i = 1; i < prices.mid.size(); ++i)
    if (single_time(prices.mid[i], b, false) < single_time(prices.mid[best], b, false)) best = i;
  const int best_rail = prices.mid[best].rail;
  const double best_s = single_time(prices.mid[best], b, false);
  const size_t unit_bytes = std::lcm(req.elem_size, req.align_bytes);
  // Whole units at most kLatencyBoundBytes, leaving room for the buffer's sub-unit tail, which
  // water_fill() may give to a held share.
  const size_t boundary_units = kLatencyBoundBytes / unit_bytes;
  const bool tail = req.count % (unit_bytes / req.elem_size) != 0;
  const size_t hold_units = tail && boundary_units > 0 ? boundary_units - 1 : boundary_units;
  const double hold_bytes = static_cast<double>(hold_units * unit_bytes);
  enum class Band { kMid, kSmall, kHeld, kOut };
  std::vector<Band> band(prices.mid.size(), Band::kMid);
  std::vector<bool> moved(prices.mid.size(), false);
  std::ostringstream why;
  const auto priced = [&](size_t i) -> const Lane& {
    return band[i] == Band::kMid ? prices.mid[i] : prices.small[i];
  };
  for (size_t round = 0; round <= 2 * prices.mid.size() + 1; ++round) {
    std::vector<size_t> from;  // the rails water-filled, by alpha as water_level() needs them
    size_t n_held = 0;
    double held_finish = 0;
    for (size_t i = 0; i < band.size(); ++i) {
      if (band[i] == Band::kHeld) {
        ++n_held;
        held_finish = std::max(held_finish, single_time(prices.small[i], hold_bytes, true));
      } else if (band[i] != Band::kOut) {
        from.push_back(i);
      }
    }
    const double rest = b - static_cast<double>(n_held) * hold_bytes;
    if (from.empty() || rest <= 0) break;
    std::stable_sort(from.begin(), from.end(),
                     [&](size_t x, size_t y) { return priced(x).alpha_s < priced(y).alpha_s; });
    std::vector<Lane> lanes;
    for (size_t i : from) lanes.push_back(priced(i));
    size_t active = 0;
    const double level = water_level(lanes, rest, &active);
    if (active + n_held < 2) break;
    bool agreed = true;
    for (size_t k = 0; k < active; ++k) {
      // In whole units, as water_fill() rounds it: a share the water level puts a rounding error
      // past the boundary still runs the log-step.
      const double units = std::floor((level - lanes[k].alpha_s) * lanes[k].beta_Bps / unit_bytes);
      const Band want = units * static_cast<double>(unit_bytes) > static_cast<double>(kLatencyBoundBytes)
                            ? Band::kMid
                            : Band::kSmall;
      const size_t i = from[k];
      if (band[i] == want) continue;
      agreed = false;
      if (from.size() == 1) {  // the rest is its share whatever its price: nothing to bounce
        band[i] = want;
        continue;
      }
      band[i] = !moved[i] ? want : hold_units > 0 ? Band::kHeld : Band::kOut;
      moved[i] = true;
    }
    if (!agreed) continue;
    const double finish = std::max(level, held_finish);
    if (finish > (1 - kMinStripingGain) * best_s) break;
    std::vector<size_t> held(req.rails.size(), 0);
    for (size_t i = 0; i < band.size(); ++i)
      if (band[i] == Band::kHeld) held[static_cast<size_t>(prices.mid[i].rail)] = hold_units;
    Plan plan = water_fill(lanes, active, level, req.count, req.elem_size, unit_bytes / req.elem_size,
                           req.rails.size(), held);
    why << "hot: " << bytes << " B (mid band) over " << plan.shares.size() << " rails";
    if (n_held > 0) why << " (" << n_held << " held at " << hold_units * unit_bytes << " B)";
    why << ", predicted " << finish * 1e6 << " us against " << best_s * 1e6 << " us on rail "
        << best_rail << " alone";
    plan.why = why.str();
    return plan;
  }
  why << "cold: " << bytes << " B (mid band) not worth striping; all on rail " << best_rail
      << ", predicted " << best_s * 1e6 << " us";
  return whole_on(best_rail, req.count, why.str());
}

}  // namespace

namespace {

void check_request(const PlanRequest& req, const std::string& who) {
  if (req.elem_size == 0) throw InvalidArgument(who + ": elem_size is 0");
  if (req.align_bytes == 0) throw InvalidArgument(who + ": align_bytes is 0");
  if (req.rails.size() != req.usable.size())
    throw InvalidArgument(who + ": " + std::to_string(req.rails.size()) + " rail estimates but " +
                          std::to_string(req.usable.size()) + " usable flags");
  if (req.count > SIZE_MAX / req.elem_size)
    throw InvalidArgument(who + ": " + std::to_string(req.count) + " elements of " +
                          std::to_string(req.elem_size) + " bytes overflow size_t");
}

}  // namespace

Plan plan_whole(const PlanRequest& req, const std::string& why) {
  check_request(req, "plan_whole");
  if (req.count == 0) return Plan{{}, false, "empty payload"};
  const size_t bytes = req.count * req.elem_size;
  int best = -1;
  double best_s = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < req.rails.size(); ++i) {
    if (!req.usable[i] || !req.rails[i].known()) continue;
    const double t = predicted_seconds(req.rails[i], bytes);
    if (t < best_s) {
      best_s = t;
      best = static_cast<int>(i);
    }
  }
  if (best < 0) throw NezhaError("plan_whole: none of the " + std::to_string(req.rails.size()) +
                                 " rails is usable and measured");
  std::ostringstream out;
  out << why << "; all " << bytes << " B on rail " << best << ", predicted " << best_s * 1e6 << " us";
  return whole_on(best, req.count, out.str());
}

Plan plan_split(const PlanRequest& req) {
  check_request(req, "plan_split");
  if (req.count == 0) return Plan{{}, false, "empty payload"};

  int first_usable = -1;
  bool any_unknown = false;
  for (size_t i = 0; i < req.rails.size(); ++i) {
    if (!req.usable[i]) continue;
    if (first_usable < 0) first_usable = static_cast<int>(i);
    if (!req.rails[i].known()) any_unknown = true;
  }
  if (first_usable < 0)
    throw NezhaError("plan_split: none of the " + std::to_string(req.rails.size()) +
                     " rails is usable");

  const std::vector<Lane> lanes = known_lanes(req.rails, req.usable);
  // Lowest latency among the usable known rails (ties: lower index).
  int cold_rail = first_usable;
  double cold_latency = std::numeric_limits<double>::infinity();
  for (const Lane& l : lanes)
    if (l.latency_s < cold_latency || (l.latency_s == cold_latency && l.rail < cold_rail)) {
      cold_latency = l.latency_s;
      cold_rail = l.rail;
    }
  const size_t bytes = req.count * req.elem_size;
  std::ostringstream why;
  if (any_unknown) {
    why << "cold: a usable rail has no estimate yet; all " << bytes << " B on rail " << cold_rail;
    return whole_on(cold_rail, req.count, why.str());
  }
  if (in_mid_band(bytes)) {
    const MidBandLanes prices = mid_band_lanes(req.rails, req.usable);
    if (!prices.mid.empty()) return plan_mid_band(prices, req, bytes);
  }
  const size_t threshold = striping_threshold_bytes(req.rails, req.usable);
  if (bytes < threshold) {
    // Whole on the rail predicted to finish first at this size: the lowest latency for tiny
    // payloads, the highest beta for large ones that striping would not speed up.
    why << "cold: " << bytes << " B below striping threshold ";
    if (threshold == SIZE_MAX)
      why << "(never)";
    else
      why << threshold << " B";
    return plan_whole(req, why.str());
  }

  const size_t unit_bytes = std::lcm(req.elem_size, req.align_bytes);
  size_t active = 0;
  const double level = water_level(lanes, static_cast<double>(bytes), &active);
  Plan plan = water_fill(lanes, active, level, req.count, req.elem_size, unit_bytes / req.elem_size,
                         req.rails.size());
  why << "hot: " << bytes << " B over " << plan.shares.size() << " of " << lanes.size()
      << " rails, predicted " << level * 1e6 << " us";
  plan.why = why.str();
  return plan;
}

}  // namespace nezha::multirail
