// The engine holds rails only through the Rail contract (transport/rail.h) and builds them with the
// rail factory: a rail kind it has never heard of (the in-memory test rail, registered by the
// test) carries collectives, and a host-local rail that does not reach every rank is refused,
// naming the rail.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::allreduce_and_check;
using testing::Cluster;
using testing::memory_rails;

TEST(EngineRailContract, HostLocalRailThatMissesRanksIsRefusedNamingIt) {
  // Four ranks on two "hosts" of two: the rail reaches only half the job.
  try {
    Cluster c(4, memory_rails(1, "host_size=2"));
    FAIL() << "a host-local rail reaching half the job was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rail 'mem0' (kind memory)"), std::string::npos) << what;
    EXPECT_NE(what.find("reaches only the ranks of this host"), std::string::npos) << what;
  }
}

TEST(EngineRailContract, HostLocalRailReachingEveryRankCarriesTheJob) {
  Cluster c(3, memory_rails(1, "host_size=3"), [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; });
  const auto before = c[0].rail_stats();
  allreduce_and_check(c, "one-host", 100000);
  const auto after = c[0].rail_stats();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].kind, "memory");
  EXPECT_GT(after[0].bytes_sent, before[0].bytes_sent);  // the data went over the memory rail
}

TEST(EngineRailContract, UnknownKindFailsEngineConstructionNamingIt) {
  EngineConfig cfg;
  cfg.rails = {RailConfig{"x", "127.0.0.1", "no-such-kind", {}}};
  try {
    Engine e(cfg);
    FAIL() << "an engine was built with an unknown rail kind";
  } catch (const InvalidArgument& ex) {
    EXPECT_NE(std::string(ex.what()).find("unknown rail kind 'no-such-kind'"), std::string::npos) << ex.what();
  }
}

TEST(EngineRailContract, OpaqueAddressesWithNulBytesReachTheRail) {
  // The memory rail's addresses hold NUL and 0xff; its connect() refuses an altered one.
  Cluster c(2, memory_rails(1));
  const std::vector<std::string> addrs = c[0].listen_addresses();
  ASSERT_EQ(addrs.size(), 3u);  // control paths (the rail's, shared memory), the rail
  EXPECT_NE(addrs[2].find('\0'), std::string::npos);
  allreduce_and_check(c, "after-connect", 1000);
}

}  // namespace
}  // namespace nezha::engine
