// Hierarchical allreduce end to end (ranks as threads): hosts share a host lane (the in-memory test
// rail with hosts=..., or real shm with a host entry per rank), network rails (in-memory or loopback
// TCP) carry the cross-host slices. Every dtype x op against a serial reference, bit-identical on
// every rank, for 2 + 2 and the uneven 3 + 1 placement; a network rail lost mid-run is redone exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "collectives/typed_values.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::expect_ok;
using testing::make_request;
using testing::submit;

// Host of each rank for a placement written "2-2" / "3-1".
std::vector<int> hosts_of(const std::string& placement) {
  std::vector<int> out;
  int h = 0;
  for (char c : placement) {
    if (c == '-') ++h;
    else for (int i = 0; i < c - '0'; ++i) out.push_back(h);
  }
  return out;
}

// What the launcher would say: each rank's host entry and how many ranks share its host.
void place(EngineConfig& c, const std::vector<int>& host_of) {
  c.host_id = "h" + std::to_string(host_of[c.rank]);
  c.local_size = 0;
  for (int h : host_of) c.local_size += h == host_of[c.rank];
  c.cross_size = host_of.back() + 1;
  c.control_inline_bytes = 0;  // small allreduces too must run on the rails
  // Only the failover test fails rails: elsewhere a slow (sanitized) run must not fail one over
  // (a redo would also move more bytes than the counts checked below).
  c.rail_stall_ms = 5000;
  c.control_addr = "127.0.0.1";
}

std::vector<RailConfig> memory_job(const std::string& placement, int network_rails) {
  std::vector<RailConfig> rails = testing::memory_rails(network_rails);
  RailConfig lane = testing::memory_rails(1, "hosts=" + placement)[0];
  lane.name = "lane";
  rails.push_back(lane);
  return rails;
}

RailConfig shm_lane(bool automatic = false) {
  RailConfig rc{"shm", "", "shm", {{"ring_bytes", "131072"}}};
  rc.automatic = automatic;
  return rc;
}

// The expected element i in `dtype`: the serial reduction of every rank's input, wrapped into the
// dtype as the kernels' integer arithmetic wraps; Average divides the sum as the engine's postscale does.
std::vector<uint8_t> expected(DataType dtype, ReduceOp op, int size, size_t count) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const double v = nezha::testing::reference_reduction(op, dtype, size, i);
    const int64_t w = static_cast<int64_t>(v);
    switch (dtype) {
      case DataType::kUInt8: out[i] = static_cast<uint8_t>(w); break;
      case DataType::kInt8: reinterpret_cast<int8_t*>(out.data())[i] = static_cast<int8_t>(w); break;
      case DataType::kInt16: reinterpret_cast<int16_t*>(out.data())[i] = static_cast<int16_t>(w); break;
      case DataType::kUInt16: reinterpret_cast<uint16_t*>(out.data())[i] = static_cast<uint16_t>(w); break;
      default: nezha::testing::store_value(dtype, out.data(), i, v);
    }
  }
  if (op == ReduceOp::kAverage && dtype != DataType::kBool) collectives::scale(out.data(), count, dtype, 1.0 / size);
  return out;
}

// Allreduces `count` elements of every dtype with every op on all ranks of `c`; each rank's result
// must equal the reference, byte for byte (so the ranks agree bit for bit too).
void every_dtype_and_op(Cluster& c, size_t count, const std::string& tag) {
  const int n = c.size();
  for (int d = 0; d < kNumDataTypes; ++d) {
    const auto dtype = static_cast<DataType>(d);
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      if (dtype == DataType::kBool && (op == ReduceOp::kAverage || op == ReduceOp::kSum)) continue;
      const std::string name = tag + "." + dtype_name(dtype) + "." + reduce_op_name(op);
      std::vector<std::vector<uint8_t>> in(n), out(n);
      std::vector<std::shared_ptr<OpHandle>> h(n);
      for (int r = 0; r < n; ++r) {
        in[r] = nezha::testing::make_input(dtype, r, count);
        out[r].assign(in[r].size(), 0xEE);
        h[r] = submit(c[r], make_request(OpType::kAllreduce, name, dtype, {static_cast<int64_t>(count)}, op),
                      in[r].data(), out[r].data());
      }
      for (int r = 0; r < n; ++r) expect_ok(h[r], name);
      const std::vector<uint8_t> want = expected(dtype, op, n, count);
      for (int r = 0; r < n; ++r) {
        if (out[r] == want) continue;
        const size_t es = dtype_size(dtype);
        size_t i = 0;
        while (std::memcmp(out[r].data() + i * es, want.data() + i * es, es) == 0) ++i;
        FAIL() << name << " rank " << r << " [" << i << "]: got "
               << nezha::testing::load_value(dtype, out[r].data(), i) << ", want "
               << nezha::testing::load_value(dtype, want.data(), i);
      }
    }
  }
}

class Placements : public ::testing::TestWithParam<std::string> {};

TEST_P(Placements, EveryDtypeAndOpOverMemoryRailsMatchesTheReferenceOnEveryRank) {
  const std::vector<int> host_of = hosts_of(GetParam());
  Cluster c(static_cast<int>(host_of.size()), memory_job(GetParam(), 2), [&](EngineConfig& cfg) {
    place(cfg, host_of);
    cfg.segment_bytes = 64 << 10;  // uneven placements: slices cross hosts in several interleaved chunks
  });
  ASSERT_EQ(c[0].rail_stats().size(), 2u) << "the lane is folded into the two network rails";
  EXPECT_EQ(c[0].rail_stats()[0].kind, "memory+memory");
  // Small (log-step across hosts), odd-sized (uneven slices) and large (striped, ring) payloads.
  for (size_t count : {size_t{3}, size_t{1001}, size_t{300007}}) every_dtype_and_op(c, count, "n" + std::to_string(count));
}

TEST_P(Placements, OverLoopbackTcpAndSharedMemory) {
  const std::vector<int> host_of = hosts_of(GetParam());
  std::vector<RailConfig> rails = testing::loopback_rails(2);
  rails.push_back(shm_lane());
  Cluster c(static_cast<int>(host_of.size()), rails, [&](EngineConfig& cfg) { place(cfg, host_of); });
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp+shm");
  every_dtype_and_op(c, 100003, "tcp");
  std::vector<uint64_t> lane_before(host_of.size()), net_before(host_of.size());
  for (size_t r = 0; r < host_of.size(); ++r) {
    auto s = c[static_cast<int>(r)].rail_stats();
    lane_before[r] = s[0].lane_bytes_sent + s[1].lane_bytes_sent;
    net_before[r] = s[0].bytes_sent + s[1].bytes_sent - lane_before[r];
  }
  const size_t count = 3 << 20;
  testing::allreduce_and_check(c, "large", count);
  // A rank with local peers moved part of the payload through shared memory. Across hosts each
  // rank sends only its slices: a flat ring would send 2 * 3/4 of the payload from every rank; here
  // a rank sends 2 * 1/2 * (its share of the slices): the lone rank of 3 + 1 sends at most the payload
  // (its slices are all of it), ranks of 2 + 2 half of it.
  for (size_t r = 0; r < host_of.size(); ++r) {
    auto s = c[static_cast<int>(r)].rail_stats();
    const uint64_t lane = s[0].lane_bytes_sent + s[1].lane_bytes_sent - lane_before[r];
    const uint64_t net = s[0].bytes_sent + s[1].bytes_sent - lane - lane_before[r] - net_before[r];
    int local = 0;
    for (int h : host_of) local += h == host_of[r];
    if (local > 1) EXPECT_GE(lane, count * 4 * 9 / 10) << "rank " << r;  // 2 + 2: N, 3 + 1: 4/3 N
    else EXPECT_EQ(lane, 0u) << "rank " << r;
    EXPECT_LE(net, count * 4 + (64 << 10)) << "rank " << r;  // flat: 1.5x the payload
    if (GetParam() == "2-2") EXPECT_LE(net, count * 4 / 2 + (64 << 10)) << "rank " << r;
  }
}

// Across hosts the automatic lane is the collective shm rail of each host's ranks (NEZHA_HOST_LANE):
// it runs the reduce-scatter and allgather inside the host itself; the same results, bit for bit.
TEST_P(Placements, OverLoopbackTcpAndTheCollectiveShmLane) {
  const std::vector<int> host_of = hosts_of(GetParam());
  std::vector<RailConfig> rails = testing::loopback_rails(2);
  rails.push_back(shm_lane(/*automatic=*/true));
  Cluster c(static_cast<int>(host_of.size()), rails, [&](EngineConfig& cfg) { place(cfg, host_of); });
  ASSERT_EQ(c[0].rail_stats().size(), 2u);
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp+shmcoll");
  every_dtype_and_op(c, 100003, "coll");
  std::vector<uint64_t> lane_before(host_of.size());
  for (size_t r = 0; r < host_of.size(); ++r) {
    auto s = c[static_cast<int>(r)].rail_stats();
    lane_before[r] = s[0].lane_bytes_sent + s[1].lane_bytes_sent;
  }
  testing::allreduce_and_check(c, "large", 3 << 20);
  for (size_t r = 0; r < host_of.size(); ++r) {
    auto s = c[static_cast<int>(r)].rail_stats();
    int local = 0;
    for (int h : host_of) local += h == host_of[r];
    const uint64_t lane = s[0].lane_bytes_sent + s[1].lane_bytes_sent - lane_before[r];
    if (local > 1) EXPECT_GT(lane, 0u) << "rank " << r;
    else EXPECT_EQ(lane, 0u) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Hosts, Placements, ::testing::Values("2-2", "3-1", "1-3"));

TEST(EngineHierarchical, NetworkRailLostMidRunIsRedoneWithExactResults) {
  const std::vector<int> host_of = hosts_of("2-2");
  Cluster c(4, memory_job("2-2", 2), [&](EngineConfig& cfg) {
    place(cfg, host_of);
    cfg.timeout_s = 10;
    cfg.rail_stall_ms = 1000;  // only the injected error fails a rail over
    cfg.rail_probe_backoff_s = 30;  // stays down for the rest of the test: its state is checked
    cfg.rail_probe_backoff_max_s = 30;
  });
  // Rank 2's bytes on network rail `rail` so far (not through the host lane).
  auto network_bytes = [&](int rail) {
    const auto s = c[2].rail_stats()[static_cast<size_t>(rail)];
    return s.bytes_sent - s.lane_bytes_sent;
  };
  auto down_everywhere = [&](int rail) {
    for (int r = 0; r < 4; ++r)
      if (c[r].rail_stats()[static_cast<size_t>(rail)].state != "down") return false;
    return true;
  };
  uint64_t carried[2] = {0, 0};  // by each network rail in the step before
  int failed = -1, down_at = -1;
  for (int step = 0; step < 12 && (down_at < 0 || step <= down_at + 2); ++step) {
    // Rank 2 loses a rail with the step's allreduces queued on it: they fail there and are redone
    // on the other rail; allreduce_and_check needs every result exact, no error. The rail is the
    // one that carried the step before: the planner stripes over both or, when its estimates say
    // striping gains too little (two in-memory rails share two cores), runs all on one.
    if (step == 3) {
      failed = carried[1] > carried[0] ? 1 : 0;
      c[2].testing_fail_rail(failed, "injected NIC error");
    }
    const uint64_t before[2] = {network_bytes(0), network_bytes(1)};
    for (int t = 0; t < 3; ++t) testing::allreduce_and_check(c, "s" + std::to_string(step) + "t" + std::to_string(t), 1 << 20);
    for (int rail = 0; rail < 2; ++rail) carried[rail] = network_bytes(rail) - before[rail];
    if (failed >= 0 && down_at < 0 && down_everywhere(failed)) down_at = step;
    if (down_at >= 0) {  // and stays down, while the other carries on
      EXPECT_TRUE(down_everywhere(failed)) << "step " << step;
      EXPECT_EQ(c[2].rail_stats()[static_cast<size_t>(1 - failed)].state, "up") << "step " << step;
    }
  }
  EXPECT_GE(down_at, 3) << "rail " << failed << " was not failed over on every rank by step 11";
}

TEST(EngineHierarchical, AutomaticShmOnOneHostCarriesTheAllreduces) {
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_lane(/*automatic=*/true));
  Cluster c(3, rails, [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; cfg.control_addr = "127.0.0.1"; });
  ASSERT_EQ(c[0].rail_stats().size(), 1u);
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp+shm");
  testing::allreduce_and_check(c, "auto", 1 << 20);
}

TEST(EngineHierarchical, TheKnobKeepsTheShmRingAsTheLaneAcrossHosts) {
  const std::vector<int> host_of = hosts_of("2-2");
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_lane(/*automatic=*/true));
  Cluster c(4, rails, [&](EngineConfig& cfg) {
    place(cfg, host_of);
    cfg.host_lane = "shm";
  });
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp+shm");
  testing::allreduce_and_check(c, "ring lane", 100003);
}

TEST(EngineHierarchical, AutomaticShmIsDroppedAcrossHostsWithHierarchicalOff) {
  const std::vector<int> host_of = hosts_of("2-2");
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_lane(/*automatic=*/true));
  Cluster c(4, rails, [&](EngineConfig& cfg) {
    place(cfg, host_of);
    cfg.hierarchical = false;
  });
  ASSERT_EQ(c[0].rail_stats().size(), 1u);
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp");
  testing::allreduce_and_check(c, "flat", 100000);
}

TEST(EngineHierarchical, AutomaticShmIsDroppedWhenEveryHostHasOneRank) {
  const std::vector<int> host_of = hosts_of("1-1-1");
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_lane(/*automatic=*/true));
  Cluster c(3, rails, [&](EngineConfig& cfg) { place(cfg, host_of); });
  ASSERT_EQ(c[0].rail_stats().size(), 1u);
  EXPECT_EQ(c[0].rail_stats()[0].kind, "tcp");
  testing::allreduce_and_check(c, "spread", 100000);
}

TEST(EngineHierarchical, ListedShmAcrossHostsWithHierarchicalOffIsRefusedNamingTheRanks) {
  const std::vector<int> host_of = hosts_of("2-2");
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_lane());
  try {
    Cluster c(4, rails, [&](EngineConfig& cfg) {
      place(cfg, host_of);
      cfg.hierarchical = false;
      cfg.connect_timeout_s = 5;
    });
    FAIL() << "a listed shm rail that misses ranks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("reaches only the ranks of this host"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::engine
