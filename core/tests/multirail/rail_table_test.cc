// The rail table: one planning entry point for negotiation and cache rounds, an explicit
// single-rail pick, priors before any measurement, max_share_bytes honoured.
#include "multirail/rail_table.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace nezha::multirail {
namespace {

RailEstimate est(double alpha_us, double beta_gbps) { return RailEstimate{alpha_us, beta_gbps, 100}; }

RailCostModelOptions options() {
  RailCostModelOptions o;
  o.min_samples = 2;
  return o;
}

size_t total(const std::vector<RailShare>& shares) {
  size_t n = 0;
  for (const auto& s : shares) n += s.count;
  return n;
}

// Shares tile [0, count) without gaps or overlaps.
void expect_tiles(const std::vector<RailShare>& shares, size_t count) {
  std::vector<RailShare> sorted = shares;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  size_t at = 0;
  for (const auto& s : sorted) {
    EXPECT_EQ(s.offset, at);
    at += s.count;
  }
  EXPECT_EQ(at, count);
}

// Feeds a rail's model with exact samples of alpha_us + bytes / gbps (small and large regimes).
void teach(RailTable& t, int rail, double alpha_us, double gbps) {
  for (size_t bytes : {size_t{4096}, size_t{4096}, size_t{4096}, size_t{1} << 20, size_t{2} << 20, size_t{4} << 20})
    t.observe(rail, bytes, alpha_us * 1e-6 + static_cast<double>(bytes) * 8 / (gbps * 1e9));
}

TEST(RailTable, NonSplitOperationsGetAnExplicitSingleRailPickOfTheLowestAlpha) {
  RailTable t({{"a"}, {"b"}, {"c"}}, options());
  const std::vector<bool> all(3, true);
  // Lowest alpha wins whatever the size; an unknown rail is never preferred to a known one.
  EXPECT_EQ(t.pick_single_rail({est(50, 10), est(20, 1), RailEstimate{}}, all, 1 << 20), 1);
  // Nothing known: the first usable rail.
  EXPECT_EQ(t.pick_single_rail({RailEstimate{}, RailEstimate{}, RailEstimate{}}, {false, true, true}, 8), 1);
  // Through plan(): a broadcast-like operation runs whole on one rail.
  teach(t, 0, 80, 5);
  teach(t, 1, 30, 5);
  teach(t, 2, 60, 5);
  OpToPlan op{1000, 4, false};
  Plan p = t.plan(op, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 1);
  EXPECT_EQ(p.shares[0].count, 1000u);
  // That rail down: the next lowest alpha.
  t.set_state(1, RailState::kDown);
  p = t.plan(op, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 2);
  EXPECT_FALSE(t.usable()[1]);
}

TEST(RailTable, PriorsPlanBeforeAnyMeasurement) {
  // Without priors two unmeasured rails are cold: rail 0 carries the payload (rail 1 gets only a
  // small probe share, to be measured).
  RailTable cold({{"a"}, {"b"}}, options());
  Plan p = cold.plan({8 << 20, 4, true}, PlanSource::kNegotiation);
  ASSERT_FALSE(p.striped);
  for (const auto& s : p.shares)
    if (s.rail == 0) EXPECT_GE(s.count, (8u << 20) * 9 / 10);
  // With equal priors a large payload is striped at once, about half each; a faster prior takes more.
  RailTable warm({{"a", 10, 10}, {"b", 10, 30}}, options());
  const auto est0 = warm.estimates();
  EXPECT_TRUE(est0[0].known());
  EXPECT_DOUBLE_EQ(est0[1].beta_gbps, 30);
  const size_t count = 8 << 20;
  p = warm.plan({count, 4, true}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 2u);
  expect_tiles(p.shares, count);
  size_t on_b = 0;
  for (const auto& s : p.shares)
    if (s.rail == 1) on_b = s.count;
  EXPECT_NEAR(static_cast<double>(on_b) / count, 0.75, 0.02);
  // Measurements replace the prior.
  teach(warm, 1, 10, 2);
  EXPECT_NEAR(warm.estimates()[1].beta_gbps, 2, 0.2);
}

TEST(RailTable, MaxShareBytesIsHonoured) {
  // Rail b is much faster, but may take at most 1 MiB of any operation.
  const size_t cap = 1 << 20;
  RailTable t({{"a", 10, 1}, {"b", 10, 100, cap}}, options());
  const size_t count = 16 << 20;  // float32: 64 MiB
  Plan p = t.plan({count, 4, true}, PlanSource::kNegotiation);
  expect_tiles(p.shares, count);
  for (const auto& s : p.shares)
    if (s.rail == 1) EXPECT_LE(s.count * 4, cap);
  EXPECT_EQ(total(p.shares), count);
  // A payload no rail's limit admits still goes somewhere whole (the rail with the largest limit).
  RailTable both({{"a", 10, 1, cap}, {"b", 10, 1, 2 * cap}}, options());
  p = both.plan({count, 4, true}, PlanSource::kNegotiation);
  expect_tiles(p.shares, count);
  EXPECT_EQ(total(p.shares), count);
  // The single-rail pick passes over a rail whose limit is too small while another fits.
  RailTable pick({{"a", 5, 10, 64}, {"b", 50, 10}}, options());
  EXPECT_EQ(pick.plan({1000, 4, false}, PlanSource::kNegotiation).shares.at(0).rail, 1);
  EXPECT_EQ(pick.plan({8, 4, false}, PlanSource::kNegotiation).shares.at(0).rail, 0);
}

TEST(RailTable, RoundsPlanFromTheGivenEstimatesAndAgreeWithNegotiation) {
  RailTable t({{"a"}, {"b"}}, options());
  const std::vector<RailEstimate> rank0 = {est(20, 10), est(20, 10)};
  const size_t count = 4 << 20;
  // This rank knows nothing, but the round carries rank 0's estimates: striped.
  Plan round = t.plan({count, 4, true}, PlanSource::kRound, rank0);
  EXPECT_EQ(round.shares.size(), 2u);
  expect_tiles(round.shares, count);
  // No estimates in the round: whole on rail 0 (an empty plan).
  EXPECT_TRUE(t.plan({count, 4, true}, PlanSource::kRound, {}).shares.empty());
  // A table taught those estimates plans the same for negotiation.
  RailTable taught({{"a"}, {"b"}}, options());
  teach(taught, 0, 20, 10);
  teach(taught, 1, 20, 10);
  const auto e = taught.estimates();
  Plan from_round = t.plan({count, 4, true}, PlanSource::kRound, e);
  Plan negotiated = taught.plan({count, 4, true}, PlanSource::kNegotiation);
  ASSERT_EQ(from_round.shares.size(), negotiated.shares.size());
  for (size_t i = 0; i < negotiated.shares.size(); ++i) {
    EXPECT_EQ(from_round.shares[i].rail, negotiated.shares[i].rail);
    EXPECT_EQ(from_round.shares[i].count, negotiated.shares[i].count);
  }
}

TEST(RailTable, SharesAndStatesShowInStatus) {
  RailTable t({{"a"}, {"b"}}, options());
  EXPECT_DOUBLE_EQ(t.status()[0].share, 1.0);  // everything on rail 0 until a plan says otherwise
  t.record_plan({{0, 0, 300}, {1, 300, 100}});
  EXPECT_DOUBLE_EQ(t.status()[0].share, 0.75);
  EXPECT_DOUBLE_EQ(t.status()[1].share, 0.25);
  t.set_state(1, RailState::kDown);
  EXPECT_DOUBLE_EQ(t.status()[1].share, 0.0);
  EXPECT_EQ(t.status()[1].state, RailState::kDown);
  t.set_shared_estimates({est(7, 3), est(9, 4)});
  EXPECT_DOUBLE_EQ(t.status()[1].estimate.alpha_us, 9);
  t.set_state(0, RailState::kDown);
  EXPECT_THROW(t.plan({4 << 20, 4, true}, PlanSource::kNegotiation), NezhaError);
}

// A collective rail (aggregation): its prior is the link speed itself, a ring's 2(n-1)/n less.
RailDescription agg_rail(double alpha_us, double link_gbps) {
  RailDescription d{"agg", alpha_us, share_gbps_prior(link_gbps, true, 4)};
  d.point_to_point = false;
  d.reduces = [](DataType t, ReduceOp o) { return t != DataType::kBool; };
  return d;
}

TEST(RailTable, CollectiveRailPriorIsTheLinkARingsIsTwoNMinusOneOverNLess) {
  EXPECT_DOUBLE_EQ(share_gbps_prior(1.0, true, 4), 1.0);
  EXPECT_DOUBLE_EQ(share_gbps_prior(1.0, false, 4), 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(share_gbps_prior(1.0, false, 2), 1.0);
  EXPECT_DOUBLE_EQ(share_gbps_prior(0.0, false, 4), 0.0);  // unknown stays unknown
  EXPECT_DOUBLE_EQ(share_gbps_prior(1.0, false, 1), 1.0);
}

TEST(RailTable, AllreduceStripesOverTcpAndAggregationSoBothFinishTogether) {
  // 4 ranks, both links 1 Gbit/s: the aggregation rail is worth 1.5 TCP rails, so it takes 60 %.
  RailTable t({{"tcp", 50, share_gbps_prior(1.0, false, 4)}, agg_rail(50, 1.0)}, options());
  const size_t count = 16 << 20;
  Plan p = t.plan({count, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 2u);
  expect_tiles(p.shares, count);
  const auto e = t.estimates();
  const double secs0 = e[0].alpha_us * 1e-6 + p.shares[0].count * 4 * 8 / (e[0].beta_gbps * 1e9);
  const double secs1 = e[1].alpha_us * 1e-6 + p.shares[1].count * 4 * 8 / (e[1].beta_gbps * 1e9);
  EXPECT_NEAR(secs0, secs1, 0.01 * secs0);
  EXPECT_NEAR(static_cast<double>(p.shares[1].count) / count, 0.6, 0.01);
}

TEST(RailTable, ACollectiveOnlyRailCarriesOnlyAllreducesItReduces) {
  // The aggregation rail has the lowest alpha: small allreduces go there whole (the cold path) ...
  RailTable t({{"tcp", 80, 1}, agg_rail(20, 1.0)}, options());
  Plan p = t.plan({100, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 1);
  // ... but never a broadcast-like operation (striped or not), nor an allreduce of a dtype it does
  // not reduce.
  for (bool splittable : {false, true}) {
    p = t.plan({100, 4, splittable, false, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
    ASSERT_EQ(p.shares.size(), 1u);
    EXPECT_EQ(p.shares[0].rail, 0);
  }
  p = t.plan({8 << 20, 1, true, true, DataType::kBool, ReduceOp::kMax}, PlanSource::kNegotiation);
  for (const auto& s : p.shares) EXPECT_EQ(s.rail, 0);
  EXPECT_EQ(t.usable_for({1, 4, false}), (std::vector<bool>{true, false}));
}

RailDescription host_rail(const char* name, double alpha_us, double gbps, bool collective) {
  RailDescription d{name, alpha_us, gbps};
  d.host_memory = true;
  if (collective) {
    d.point_to_point = false;
    d.reduces = [](DataType, ReduceOp) { return true; };
  }
  return d;
}

TEST(RailTable, HostMemoryRailsOfBothKindsAreNotStripedTogether) {
  // shm ring (8 Gbit/s) beside shmcoll (16 Gbit/s) beside a real NIC (2 Gbit/s).
  RailDescription nic{"eth1", 50, 2};
  RailTable t({host_rail("shm", 20, 8, false), host_rail("shmcoll", 20, 16, true), nic}, options());
  const size_t count = 16 << 20;
  Plan p = t.plan({count, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
  expect_tiles(p.shares, count);
  std::vector<size_t> by_rail(3, 0);
  for (const auto& s : p.shares) by_rail[static_cast<size_t>(s.rail)] += s.count;
  EXPECT_EQ(by_rail[0], 0u) << "the slower host-memory kind took a share";
  EXPECT_GT(by_rail[1], 0u);
  EXPECT_GT(by_rail[2], 0u) << "a rail on its own link still stripes";
  // Below kCollectiveHostMemoryBytes the estimates decide: the point-to-point kind predicted
  // faster, the collective rail is left out instead.
  RailTable u({host_rail("shm", 20, 32, false), host_rail("shmcoll", 20, 16, true)}, options());
  const size_t below = kCollectiveHostMemoryBytes / 4 / 2;
  p = u.plan({below, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 0);
  // From it on the collective kind takes the allreduce whatever the estimates say, and the ring is
  // never lent a probe share (however many large allreduces it sits out).
  for (size_t large : {kCollectiveHostMemoryBytes / 4, count}) {
    for (int op = 0; op < 40; ++op) {
      p = u.plan({large, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
      ASSERT_EQ(p.shares.size(), 1u) << large << " op " << op;
      EXPECT_EQ(p.shares[0].rail, 1) << large << " op " << op;
    }
  }
  // An allreduce the collective rail does not reduce still goes to the ring.
  RailDescription sum_only = host_rail("shmcoll", 20, 16, true);
  sum_only.reduces = [](DataType, ReduceOp o) { return o == ReduceOp::kSum; };
  RailTable w({host_rail("shm", 20, 32, false), sum_only}, options());
  p = w.plan({count, 4, true, true, DataType::kFloat32, ReduceOp::kMax}, PlanSource::kNegotiation);
  for (const auto& s : p.shares) EXPECT_EQ(s.rail, 0);
  // Rails off the host's memory stripe as before, and non-allreduce operations are unaffected.
  RailTable v({{"a", 20, 8}, host_rail("shmcoll", 20, 16, true)}, options());
  p = v.plan({count, 4, true, true, DataType::kFloat32, ReduceOp::kSum}, PlanSource::kNegotiation);
  EXPECT_EQ(p.shares.size(), 2u);
}

RailDescription shmcoll_rail(double alpha_us, double gbps) {
  RailDescription d = host_rail("shmcoll", alpha_us, gbps, true);
  d.reduces = [](DataType t, ReduceOp) { return t != DataType::kBool; };
  d.runs = [](RailOp) { return true; };
  return d;
}

TEST(RailTable, ACollectiveRailThatRunsThemTakesTheOtherCollectivesWhole) {
  // The shm ring beside shmcoll: from kCollectiveHostMemoryBytes on the collective rail runs them
  // whole whatever the estimates say (as allreduces); below, the rail predicted faster alone.
  RailTable t({host_rail("shm", 20, 32, false), shmcoll_rail(10, 16)}, options());
  const size_t large = kCollectiveHostMemoryBytes, count = 16 << 20;
  for (RailOp other : {RailOp::kBroadcast, RailOp::kAllgather, RailOp::kReducescatter, RailOp::kAlltoall})
    for (size_t bytes : {large, count * 4}) {
      Plan p = t.plan({bytes / 4, 4, true, false, DataType::kFloat32, ReduceOp::kSum, other}, PlanSource::kNegotiation);
      ASSERT_EQ(p.shares.size(), 1u);
      EXPECT_EQ(p.shares[0].rail, 1) << bytes;
      EXPECT_EQ(p.shares[0].count, bytes / 4);
      EXPECT_FALSE(p.striped);
    }
  // Small: shmcoll has the lower alpha here, so it wins; with a slower start the ring does.
  Plan p = t.plan({16, 4, true, false, DataType::kFloat32, ReduceOp::kSum, RailOp::kBroadcast}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 1);
  RailTable slow({host_rail("shm", 20, 32, false), shmcoll_rail(90, 16)}, options());
  p = slow.plan({16, 4, true, false, DataType::kFloat32, ReduceOp::kSum, RailOp::kAllgather}, PlanSource::kNegotiation);
  ASSERT_EQ(p.shares.size(), 1u);
  EXPECT_EQ(p.shares[0].rail, 0);
  // A reducescatter of a dtype it does not reduce or a process set's operation (kNone) stays on the
  // ring.
  p = t.plan({count, 1, true, false, DataType::kBool, ReduceOp::kMax, RailOp::kReducescatter}, PlanSource::kNegotiation);
  for (const auto& s : p.shares) EXPECT_EQ(s.rail, 0);
  p = t.plan({count, 4, true, false, DataType::kFloat32, ReduceOp::kSum, RailOp::kNone}, PlanSource::kNegotiation);
  for (const auto& s : p.shares) EXPECT_EQ(s.rail, 0);
  // The collective rail down: the ring.
  t.set_state(1, RailState::kDown);
  p = t.plan({count, 4, true, false, DataType::kFloat32, ReduceOp::kSum, RailOp::kBroadcast}, PlanSource::kNegotiation);
  for (const auto& s : p.shares) EXPECT_EQ(s.rail, 0);
}

TEST(RailTable, ARailThatRunsOnlyAllreducesNeverGetsTheOtherOperations) {
  // The aggregation rail: lowest alpha and a large payload, yet a broadcast stripes over the rest.
  RailTable t({{"a", 50, 1}, {"b", 50, 1}, agg_rail(5, 10)}, options());
  for (RailOp other : {RailOp::kBroadcast, RailOp::kAllgather, RailOp::kReducescatter, RailOp::kAlltoall}) {
    Plan p = t.plan({16 << 20, 4, true, false, DataType::kFloat32, ReduceOp::kSum, other}, PlanSource::kNegotiation);
    for (const auto& s : p.shares) EXPECT_NE(s.rail, 2);
    EXPECT_EQ(t.usable_for({1, 4, true, false, DataType::kFloat32, ReduceOp::kSum, other}),
              (std::vector<bool>{true, true, false}));
  }
}

}  // namespace
}  // namespace nezha::multirail
