// The engine over the ofi rail (libfabric's tcp;ofi_rxm provider on loopback, ranks as threads):
// alone, and striped beside a loopback TCP rail, with exact results. Failover of an ofi rail is in
// engine_failover_test.cc beside the other kinds'.
#include <gtest/gtest.h>

#ifdef NEZHA_WITH_OFI

#include <string>
#include <vector>

#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::allreduce_and_check;
using testing::Cluster;

RailConfig ofi_rail() {
  return RailConfig{"tcp;ofi_rxm@127.0.0.1", "tcp;ofi_rxm@127.0.0.1", "ofi", {{"chunk_bytes", "65536"}}};
}

TEST(EngineOfi, CollectivesGoOverTheOfiRail) {
  Cluster c(3, {ofi_rail()}, [](EngineConfig& cfg) {
    cfg.control_inline_bytes = 0;
    cfg.control_addr = "127.0.0.1";
  });
  for (size_t count : {size_t{1}, size_t{1000}, size_t{300000}})
    allreduce_and_check(c, "ofi." + std::to_string(count), count);
  const auto stats = c[1].rail_stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].kind, "ofi");
  EXPECT_GT(stats[0].bytes_sent, 300000u * 4 / 3);
}

TEST(EngineOfi, StripedBesideLoopbackTcp) {
  auto rails = testing::loopback_rails(1);
  rails.push_back(ofi_rail());
  Cluster c(3, rails, [](EngineConfig& cfg) {
    cfg.control_inline_bytes = 0;
    cfg.control_addr = "127.0.0.1";
  });
  for (int i = 0; i < 6; ++i) allreduce_and_check(c, "mixed." + std::to_string(i), 1 << 20);
  uint64_t tcp_bytes = 0, ofi_bytes = 0;
  for (const auto& s : c[0].rail_stats()) (s.kind == "ofi" ? ofi_bytes : tcp_bytes) += s.bytes_sent;
  EXPECT_GT(ofi_bytes, 0u);
  EXPECT_GT(tcp_bytes, 0u);
}

}  // namespace
}  // namespace nezha::engine

#endif  // NEZHA_WITH_OFI
