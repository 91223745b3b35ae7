// The engine over real shm rails (ranks as threads of one process): collectives go over shared
// memory, alone or striped beside a loopback TCP rail, with exact results; negotiation among the
// ranks of a host goes through shared memory too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::allreduce_and_check;
using testing::Cluster;

RailConfig shm_rail() { return RailConfig{"shm", "", "shm", {{"ring_bytes", "131072"}}}; }

TEST(EngineShm, CollectivesGoOverSharedMemory) {
  Cluster c(3, {shm_rail()}, [](EngineConfig& cfg) {
    cfg.control_inline_bytes = 0;
    cfg.control_addr = "127.0.0.1";
  });
  for (size_t count : {size_t{1}, size_t{1000}, size_t{300000}})
    allreduce_and_check(c, "shm." + std::to_string(count), count);
  const auto stats = c[1].rail_stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].kind, "shm");
  EXPECT_GT(stats[0].bytes_sent, 300000u * 4 / 3);
}

TEST(EngineShm, StripedBesideLoopbackTcp) {
  auto rails = testing::loopback_rails(1);
  rails.push_back(shm_rail());
  Cluster c(2, rails, [](EngineConfig& cfg) {
    cfg.control_inline_bytes = 0;
    cfg.control_addr = "127.0.0.1";
  });
  for (int i = 0; i < 6; ++i) allreduce_and_check(c, "mixed." + std::to_string(i), 1 << 20);
  uint64_t shm_bytes = 0;
  for (const auto& s : c[0].rail_stats())
    if (s.kind == "shm") shm_bytes = s.bytes_sent;
  EXPECT_GT(shm_bytes, 0u);
}

TEST(EngineShm, RanksOfOneHostNegotiateThroughSharedMemory) {
  Cluster c(3);  // one loopback TCP rail; every rank on this host
  for (int i = 0; i < 5; ++i) allreduce_and_check(c, "negotiated." + std::to_string(i), 100);
  for (int r = 0; r < 3; ++r) {
    const EngineStats s = c[r].stats();
    EXPECT_GT(s.control_messages_shared_memory, 0u) << "rank " << r;
    EXPECT_EQ(s.control_messages_network, 0u) << "rank " << r;
  }
}

TEST(EngineShm, WithoutTheHostPathNegotiationStaysOnTheNetwork) {
  Cluster c(3, testing::loopback_rails(1), [](EngineConfig& cfg) { cfg.shm_control = false; });
  allreduce_and_check(c, "negotiated", 100);
  EXPECT_EQ(c[1].stats().control_messages_shared_memory, 0u);
  EXPECT_GT(c[1].stats().control_messages_network, 0u);
  EXPECT_EQ(c[1].listen_addresses().size(), 2u);  // the rail's control path and the rail
}

}  // namespace
}  // namespace nezha::engine
