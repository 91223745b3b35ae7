// The rail factory: kinds are looked up in one table, unknown kinds fail naming themselves, and a
// new kind is one registration away (the test-only "memory" kind is registered here and used
// through make_rail exactly as the engine uses "tcp").
#include <gtest/gtest.h>

#include <cstring>

#include "collectives/memory_rail.h"
#include "common/error.h"
#include "tcp_mesh.h"
#include "transport/rail_factory.h"

namespace nezha::transport {
namespace {

using testing::run_ranks;

RailContext context(int rank, int size) {
  RailContext ctx;
  ctx.rank = rank;
  ctx.size = size;
  ctx.secret = "factory-secret";
  return ctx;
}

TEST(RailFactory, UnknownKindIsAnInvalidArgumentNamingItAndTheKnownKinds) {
  RailSpec spec = parse_rail_spec("carrier-pigeon:eth9");
  EXPECT_EQ(spec.kind, "carrier-pigeon");
  try {
    make_rail(spec, context(0, 1));
    FAIL() << "an unknown kind was built";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown rail kind 'carrier-pigeon'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tcp"), std::string::npos) << e.what();
  }
}

TEST(RailFactory, ParsesKindsAddressesAndOptions) {
  RailSpec plain = parse_rail_spec("127.0.0.1");
  EXPECT_EQ(plain.kind, "tcp");
  EXPECT_EQ(plain.local_addr, "127.0.0.1");
  RailSpec mptcp = parse_rail_spec("mptcp:10.0.0.1;max_share_bytes=4096");
  EXPECT_EQ(mptcp.kind, "mptcp");
  EXPECT_EQ(mptcp.local_addr, "10.0.0.1");
  EXPECT_EQ(mptcp.options.at("max_share_bytes"), "4096");
  RailSpec bare = parse_rail_spec("tcp");  // a kind alone: no address
  EXPECT_EQ(bare.kind, "tcp");
  EXPECT_TRUE(bare.local_addr.empty());
  EXPECT_THROW(parse_rail_spec(""), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("tcp:"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec(":eth0"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("tcp:lo;nonsense"), InvalidArgument);
}

TEST(RailFactory, AnOfiTargetMayContainSemicolonsAndOptionsAreTheKeyValueParts) {
  RailSpec ofi = parse_rail_spec("ofi:tcp;ofi_rxm@10.50.0.1;window=4;chunk_bytes=65536");
  EXPECT_EQ(ofi.kind, "ofi");
  EXPECT_EQ(ofi.local_addr, "tcp;ofi_rxm@10.50.0.1");
  EXPECT_EQ(ofi.name, "tcp;ofi_rxm@10.50.0.1");
  EXPECT_EQ(ofi.options.size(), 2u);
  EXPECT_EQ(ofi.options.at("window"), "4");
  EXPECT_EQ(ofi.options.at("chunk_bytes"), "65536");
  RailSpec verbs = parse_rail_spec("ofi:verbs;ofi_rxm@10.60.0.1");
  EXPECT_EQ(verbs.local_addr, "verbs;ofi_rxm@10.60.0.1");
  EXPECT_TRUE(verbs.options.empty());
  RailSpec shm = parse_rail_spec("ofi:shm");
  EXPECT_EQ(shm.local_addr, "shm");
  // Once an option started, a part without '=' is malformed again; other kinds never continue.
  EXPECT_THROW(parse_rail_spec("ofi:tcp;window=4;ofi_rxm@10.0.0.1"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("tcp:lo;ofi_rxm"), InvalidArgument);
}

TEST(RailFactory, TcpAndMptcpKindsBuildTcpRailsDescribingThemselves) {
  for (const char* kind : {"tcp", "mptcp"}) {
    RailSpec spec = parse_rail_spec(std::string(kind) + ":127.0.0.1;max_share_bytes=65536");
    std::unique_ptr<Rail> rail;
    try {
      rail = make_rail(spec, context(0, 2));
    } catch (const NezhaError& e) {
      if (std::string(kind) == "mptcp") {  // kernels without MPTCP say so clearly
        EXPECT_NE(std::string(e.what()).find("MPTCP"), std::string::npos) << e.what();
        continue;
      }
      throw;
    }
    EXPECT_EQ(rail->properties().kind, kind);
    EXPECT_EQ(rail->properties().name, "127.0.0.1");
    EXPECT_EQ(rail->properties().reach, RailReach::kJob);
    EXPECT_EQ(rail->properties().max_share_bytes, 65536u);
    EXPECT_EQ(rail->local_address().rfind("127.0.0.1:", 0), 0u) << rail->local_address();
    EXPECT_FALSE(rail->reaches(1));  // not connected yet
  }
}

TEST(RailFactory, TcpRejectsUnknownOptionsAndMissingAddress) {
  EXPECT_THROW(make_rail(parse_rail_spec("tcp:127.0.0.1;colour=blue"), context(0, 1)), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("tcp:127.0.0.1;max_share_bytes=-1"), context(0, 1)), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("tcp"), context(0, 1)), InvalidArgument);
}

TEST(RailFactory, TcpRailsFromTheFactoryConnectAndExchange) {
  const int n = 3;
  std::vector<std::unique_ptr<Rail>> rails;
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) {
    rails.push_back(make_rail(parse_rail_spec("tcp:127.0.0.1"), context(r, n)));
    addrs.push_back(rails.back()->local_address());
  }
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) EXPECT_EQ(rails[r]->reaches(p), p != r) << r << "->" << p;
  run_ranks(n, [&](int r) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    uint32_t out = 100 + r, in = 0;
    rails[r]->sendrecv(next, &out, sizeof out, prev, &in, sizeof in, 7, Deadline::after_seconds(10));
    EXPECT_EQ(in, 100u + prev);
  });
  // reset() + connect() re-forms the rail (failover re-admission).
  for (auto& rail : rails) rail->reset();
  for (int r = 0; r < n; ++r) EXPECT_FALSE(rails[r]->reaches((r + 1) % n));
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  run_ranks(n, [&](int r) {
    uint32_t out = 7 * r, in = 0;
    const int peer = r ^ 1;
    if (peer >= n) return;
    rails[r]->sendrecv(peer, &out, sizeof out, peer, &in, sizeof in, 8, Deadline::after_seconds(10));
    EXPECT_EQ(in, 7u * peer);
  });
  for (auto& rail : rails) rail->close();
  for (auto& rail : rails) rail->close();  // idempotent
}

TEST(RailFactory, ANewKindIsOneRegistrationLine) {
  nezha::testing::register_memory_rail_kind();
  const auto kinds = known_rail_kinds();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "memory"), kinds.end());
  EXPECT_THROW(register_rail_kind("memory", &nezha::testing::make_memory_rail), InvalidArgument);

  const int n = 2;
  RailSpec spec = parse_rail_spec("memory;world=factory-test");
  EXPECT_EQ(spec.kind, "memory");
  std::vector<std::unique_ptr<Rail>> rails;
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) {
    rails.push_back(make_rail(spec, context(r, n)));
    addrs.push_back(rails.back()->local_address());
  }
  EXPECT_NE(addrs[0].find('\0'), std::string::npos);  // opaque bytes, NUL included
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(5)); });
  run_ranks(n, [&](int r) {
    double out = 1.5 + r, in = 0;
    rails[r]->sendrecv(1 - r, &out, sizeof out, 1 - r, &in, sizeof in, 3, Deadline::after_seconds(5));
    EXPECT_EQ(in, 1.5 + (1 - r));
  });
  // An address altered on the way is refused, naming the rank whose address it was.
  std::vector<std::string> mangled = addrs;
  mangled[1] = std::string(mangled[1].c_str());  // cut at the NUL, as a C-string path would
  rails[0]->reset();
  EXPECT_THROW(rails[0]->connect(mangled, Deadline::after_seconds(1)), ProtocolError);
}

}  // namespace
}  // namespace nezha::transport
