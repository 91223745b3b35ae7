// The aggregation rail through the rail factory: its spec, options, capabilities and the errors a
// bad spec gets, before any daemon is involved.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "transport/collective_rail.h"
#include "transport/rail_factory.h"

namespace nezha::transport {
namespace {

RailContext ctx(int size = 4) {
  RailContext c;
  c.rank = size > 1 ? 1 : 0;
  c.size = size;
  c.secret = "job";
  return c;
}

TEST(AggRailFactory, SpecNamesTheDaemonAndTheRailIsACollectiveRail) {
  const RailSpec spec = parse_rail_spec("agg:10.51.0.5:7219;window=4;gbps=1");
  EXPECT_EQ(spec.kind, "agg");
  EXPECT_EQ(spec.local_addr, "10.51.0.5:7219");
  auto rail = make_rail(spec, ctx());
  const RailProperties& p = rail->properties();
  EXPECT_EQ(p.kind, "agg");
  EXPECT_DOUBLE_EQ(p.gbps_prior, 1.0);
  // Its kind answers the one question: collective, not point to point (it has no send or recv).
  EXPECT_EQ(rail->as_point_to_point(), nullptr);
  CollectiveRail* coll = rail->as_collective();
  ASSERT_NE(coll, nullptr);
  EXPECT_TRUE(coll->reduces(DataType::kBFloat16, ReduceOp::kProduct));
  EXPECT_EQ(rail->local_address().size(), 8u);  // the job id candidate: random bytes
  char b = 0;
  // Not connected: an allreduce fails at once, naming the daemon.
  try {
    coll->start_allreduce(&b, &b, 1, DataType::kUInt8, ReduceOp::kSum, 0);
    FAIL() << "an unconnected aggregation rail started an allreduce";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("nezha-aggd at 10.51.0.5:7219"), std::string::npos) << e.what();
  }
}

TEST(AggRailFactory, BadSpecsAreRefusedNamingTheRail) {
  EXPECT_THROW(make_rail(parse_rail_spec("agg:10.51.0.5:7219;bogus=1"), ctx()), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("agg:daemon-host:7219"), ctx()), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("agg:10.51.0.5:7219;chunk_bytes=100"), ctx()), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("agg:10.51.0.5:7219;window=0"), ctx()), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("agg:10.51.0.5:7219;secret_file=/nonexistent/key"), ctx()),
               InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("agg:10.51.0.5:7219"), ctx(5000)), InvalidArgument);
}

TEST(AggRailFactory, ConnectingToNoDaemonFailsWithinTheDeadlineNamingIt) {
  auto rail = make_rail(parse_rail_spec("agg:127.0.0.1:1"), ctx(1));
  try {
    rail->connect({rail->local_address()}, Deadline::after_seconds(5));
    FAIL() << "connected to nothing";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("nezha-aggd at 127.0.0.1:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::transport
