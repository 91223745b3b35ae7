// The rail factory and the spec grammar: kinds are rows of one table, unknown kinds fail naming
// themselves, and a new kind is one row away (the test-only "memory" transport, a folder of its own,
// is registered here and used through make_rail exactly as the engine uses "tcp"; the grammar
// follows a registered row's target form).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

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

// The rail as the point-to-point rail its kind builds (a failed test, not a crash, if it is not).
PointToPointRail& p2p(const std::unique_ptr<Rail>& rail) {
  PointToPointRail* p = rail->as_point_to_point();
  if (!p) throw std::logic_error("rail '" + rail->properties().name + "' is not point to point");
  return *p;
}

TEST(RailFactory, UnknownKindIsAnInvalidArgumentNamingItAndTheKnownKinds) {
  // Refused by the grammar, and by the factory for a spec made without it.
  try {
    parse_rail_spec("carrier-pigeon:eth9");
    FAIL() << "an unknown kind was parsed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown rail kind 'carrier-pigeon'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tcp"), std::string::npos) << e.what();
  }
  RailSpec spec;
  spec.kind = "carrier-pigeon";
  spec.name = "eth9";
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
  RailSpec mptcp = parse_rail_spec(" MPTCP:10.0.0.1 ; max_share_bytes = 4096 ");
  EXPECT_EQ(mptcp.kind, "mptcp");
  EXPECT_EQ(mptcp.local_addr, "10.0.0.1");
  EXPECT_EQ(mptcp.options.at("max_share_bytes"), "4096");
  RailSpec shm = parse_rail_spec("shm;ring_bytes=65536");  // a kind without a target, alone
  EXPECT_EQ(shm.kind, "shm");
  EXPECT_EQ(shm.name, "shm");
  EXPECT_TRUE(shm.local_addr.empty());
  EXPECT_THROW(parse_rail_spec(""), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("tcp"), InvalidArgument);  // its row wants a target
  EXPECT_THROW(parse_rail_spec("tcp:"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec(":eth0"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("shm:eth0"), InvalidArgument);  // its row has no target
  EXPECT_THROW(parse_rail_spec("tcp:lo;nonsense"), InvalidArgument);
  EXPECT_THROW(parse_rail_spec("tcp:lo;a=1;a=2"), InvalidArgument);
}

TEST(RailFactory, AListKeepsItsItemsAndTheirOptionsInOrderAndNamesTheBadItem) {
  const auto items = parse_rail_list("eth1, agg:10.51.0.5:7219;window=4;gbps=1 ,shm");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].kind, "tcp");
  EXPECT_EQ(items[0].target_form, RailTarget::kLocalAddress);
  EXPECT_EQ(items[0].target, "eth1");
  EXPECT_EQ(items[1].kind, "agg");
  EXPECT_EQ(items[1].target_form, RailTarget::kHostPort);
  EXPECT_EQ(items[1].target, "10.51.0.5:7219");
  using Options = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(items[1].options, (Options{{"window", "4"}, {"gbps", "1"}}));
  EXPECT_EQ(items[2].target_form, RailTarget::kNone);
  auto message = [](const std::string& spec) {
    try {
      parse_rail_list(spec);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(parsed)");
  };
  EXPECT_NE(message("eth1,,eth2").find("empty item"), std::string::npos);
  EXPECT_NE(message("eth1,carrier:eth2").find("rail 'carrier:eth2': unknown rail kind 'carrier'; known kinds: agg"),
            std::string::npos) << message("eth1,carrier:eth2");
  for (const char* bad : {"agg:", "agg:10.0.0.1", "agg:host:7219", "agg:10.0.0.1:0", "agg:10.0.0.1:99999"})
    EXPECT_NE(message(bad).find("expected agg:<IPv4 address>:<port>"), std::string::npos) << bad;
  EXPECT_NE(message("ofi:@10.0.0.1").find("expected ofi:PROVIDER@"), std::string::npos);
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
    EXPECT_EQ(rail->as_collective(), nullptr);
    EXPECT_FALSE(p2p(rail).reaches(1));  // not connected yet
  }
}

TEST(RailFactory, TcpRejectsUnknownOptionsAndMissingAddress) {
  EXPECT_THROW(make_rail(parse_rail_spec("tcp:127.0.0.1;colour=blue"), context(0, 1)), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("tcp:127.0.0.1;max_share_bytes=-1"), context(0, 1)), InvalidArgument);
  RailSpec unresolved;  // a caller that skipped resolution
  unresolved.kind = "tcp";
  EXPECT_THROW(make_rail(unresolved, context(0, 1)), InvalidArgument);
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
    for (int p = 0; p < n; ++p) EXPECT_EQ(p2p(rails[r]).reaches(p), p != r) << r << "->" << p;
  run_ranks(n, [&](int r) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    uint32_t out = 100 + r, in = 0;
    p2p(rails[r]).sendrecv(next, &out, sizeof out, prev, &in, sizeof in, 7, Deadline::after_seconds(10));
    EXPECT_EQ(in, 100u + prev);
  });
  // reset() + connect() re-forms the rail (failover re-admission).
  for (auto& rail : rails) rail->reset();
  for (int r = 0; r < n; ++r) EXPECT_FALSE(p2p(rails[r]).reaches((r + 1) % n));
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  run_ranks(n, [&](int r) {
    uint32_t out = 7 * r, in = 0;
    const int peer = r ^ 1;
    if (peer >= n) return;
    p2p(rails[r]).sendrecv(peer, &out, sizeof out, peer, &in, sizeof in, 8, Deadline::after_seconds(10));
    EXPECT_EQ(in, 7u * peer);
  });
  for (auto& rail : rails) rail->close();
  for (auto& rail : rails) rail->close();  // idempotent
}

TEST(RailFactory, ANewKindIsOneRow) {
  nezha::testing::register_memory_rail_kind();
  const auto kinds = known_rail_kinds();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "memory"), kinds.end());
  EXPECT_THROW(register_rail_kind({"memory", &nezha::testing::make_memory_rail}), InvalidArgument);
  EXPECT_THROW(register_rail_kind({"Pigeon", &nezha::testing::make_memory_rail}), InvalidArgument);
  EXPECT_THROW(register_rail_kind({"pi:geon", &nezha::testing::make_memory_rail}), InvalidArgument);

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
    p2p(rails[r]).sendrecv(1 - r, &out, sizeof out, 1 - r, &in, sizeof in, 3, Deadline::after_seconds(5));
    EXPECT_EQ(in, 1.5 + (1 - r));
  });
  // An address altered on the way is refused, naming the rank whose address it was.
  std::vector<std::string> mangled = addrs;
  mangled[1] = std::string(mangled[1].c_str());  // cut at the NUL, as a C-string path would
  rails[0]->reset();
  EXPECT_THROW(rails[0]->connect(mangled, Deadline::after_seconds(1)), ProtocolError);
}

// A rail with the base contract only: lifecycle and counters, no way to carry work.
class KindlessRail : public Rail {
 public:
  const RailProperties& properties() const override { return props_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string local_address() const override { return {}; }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  RailCounters counters() const override { return {}; }
  void abort(const std::string&) override {}

 private:
  RailProperties props_;
};

std::unique_ptr<Rail> make_kindless_rail(const RailSpec&, const RailContext&) {
  return std::make_unique<KindlessRail>();
}

TEST(RailFactory, ARailThatIsNeitherPointToPointNorCollectiveIsRefusedNamingTheKind) {
  static std::once_flag once;
  std::call_once(once, [] { register_rail_kind({"kindless", &make_kindless_rail}); });
  RailSpec spec;
  spec.kind = "kindless";
  spec.name = "k0";
  try {
    make_rail(spec, context(0, 1));
    FAIL() << "a rail of neither kind was built";
  } catch (const NezhaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rail 'k0'"), std::string::npos) << what;
    EXPECT_NE(what.find("kind 'kindless'"), std::string::npos) << what;
    EXPECT_NE(what.find("neither point-to-point nor collective"), std::string::npos) << what;
  }
}

TEST(RailFactory, TheGrammarFollowsARegisteredRow) {
  // A kind the table does not ship, whose target is PROVIDER@WHERE and may contain ';'.
  static std::once_flag once;
  std::call_once(once, [] {
    register_rail_kind({"pigeon", &nezha::testing::make_memory_rail, RailTarget::kProviderAtLocalAddress, true});
  });
  const RailItem item = parse_rail_item("Pigeon:loft;north@10.9.0.0/24;world=w");
  EXPECT_EQ(item.kind, "pigeon");
  EXPECT_EQ(item.target_form, RailTarget::kProviderAtLocalAddress);
  EXPECT_EQ(item.target, "loft;north@10.9.0.0/24");
  ASSERT_EQ(item.options.size(), 1u);
  EXPECT_EQ(item.options[0].first, "world");
  EXPECT_THROW(parse_rail_item("pigeon:@10.9.0.1"), InvalidArgument);
  const auto table = rail_kind_table();
  auto row = std::find_if(table.begin(), table.end(), [](const RailKind& k) { return k.kind == "pigeon"; });
  ASSERT_NE(row, table.end());
  EXPECT_TRUE(row->target_continues_after_semicolon);
  EXPECT_TRUE(std::is_sorted(table.begin(), table.end(),
                             [](const RailKind& a, const RailKind& b) { return a.kind < b.kind; }));
  // Only rows with a message path carry the control channel.
  RailSpec spec = parse_rail_spec("mptcp:127.0.0.1");
  EXPECT_THROW(make_message_path(spec, context(0, 1)), InvalidArgument);
}

}  // namespace
}  // namespace nezha::transport
