// The engine over a loopback TCP rail and an aggregation rail (nezha-aggd in-process; ranks as
// threads): allreduces striped over both with exact results, other collectives kept off the
// collective rail, and the daemon killed mid-run (shares fail over to TCP, results exact) and
// restarted (the rail is probed and re-admitted); killed once some of a share's sums landed (the
// redo starts from the input kept chunk by chunk).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "aggd/agg_daemon.h"
#include "common/error.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::allreduce_and_check;
using testing::Cluster;

std::unique_ptr<aggd::AggDaemon> start_daemon(const std::string& listen = "127.0.0.1:0") {
  aggd::AggDaemonOptions o;
  o.listen = listen;
  o.secret = "agg-engine-key";
  auto d = std::make_unique<aggd::AggDaemon>(o);
  d->start();
  return d;
}

// A daemon back at the address of one that died. Its port may be held for a moment by another
// socket: the rail's probes connect to it from ports of the same ephemeral range, and a connect to a
// closed local port can be given that very port (a TCP self-connect) until the rail drops it; any
// other process's connection can draw it too. So the bind is retried for a bounded time.
std::unique_ptr<aggd::AggDaemon> restart_daemon(const std::string& address) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    try {
      return start_daemon(address);
    } catch (const NezhaError& e) {
      if (std::string(e.what()).find("Address already in use") == std::string::npos ||
          std::chrono::steady_clock::now() > until)
        throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

std::vector<RailConfig> tcp_and_agg(const aggd::AggDaemon& d) {
  ::setenv("NEZHA_AGG_SECRET", "agg-engine-key", 1);
  auto rails = testing::loopback_rails(1);
  rails.push_back(RailConfig{"agg", d.address(), "agg", {{"chunk_bytes", "65536"}}});
  return rails;
}

const RailStat& stat_of(const std::vector<RailStat>& stats, const std::string& kind) {
  for (const auto& s : stats)
    if (s.kind == kind) return s;
  throw std::runtime_error("no rail of kind " + kind);
}

void tweak(EngineConfig& c) {
  c.control_inline_bytes = 0;
  c.rail_stall_ms = 200;
}

TEST(EngineAgg, AllreducesStripeOverTcpAndAggregationExactly) {
  auto daemon = start_daemon();
  Cluster c(4, tcp_and_agg(*daemon), tweak);
  for (int i = 0; i < 8; ++i) allreduce_and_check(c, "big." + std::to_string(i), 1 << 20);
  for (size_t count : {size_t{1}, size_t{100}, size_t{5000}}) allreduce_and_check(c, "small." + std::to_string(count), count);
  const auto stats = c[2].rail_stats();
  EXPECT_GT(stat_of(stats, "agg").bytes_sent, 0u);
  EXPECT_GT(stat_of(stats, "tcp").bytes_sent, 0u);
  EXPECT_EQ(stat_of(stats, "agg").state, "up");
  EXPECT_GT(daemon->stats().chunks_reduced, 0u);
}

TEST(EngineAgg, OtherCollectivesNeverUseTheCollectiveRail) {
  auto daemon = start_daemon();
  Cluster c(3, tcp_and_agg(*daemon), tweak);
  const uint64_t agg_before = stat_of(c[0].rail_stats(), "agg").bytes_sent;
  std::vector<std::vector<int32_t>> buf(3, std::vector<int32_t>(100000));
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < buf[r].size(); ++i) buf[r][i] = r == 1 ? static_cast<int32_t>(i) : -1;
  std::vector<std::shared_ptr<OpHandle>> h;
  for (int r = 0; r < 3; ++r) {
    Request req = testing::make_request(OpType::kBroadcast, "bcast", DataType::kInt32, {100000});
    req.root = 1;
    h.push_back(testing::submit(c[r], req, buf[r].data(), buf[r].data()));
  }
  for (auto& x : h) testing::expect_ok(x, "broadcast");
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < buf[r].size(); ++i) ASSERT_EQ(buf[r][i], static_cast<int32_t>(i));
  EXPECT_EQ(stat_of(c[0].rail_stats(), "agg").bytes_sent, agg_before);
}

TEST(EngineAgg, DaemonKilledMidRunFailsOverToTcpAndIsReadmittedAfterRestart) {
  auto daemon = start_daemon();
  const std::string address = daemon->address();
  Cluster c(4, tcp_and_agg(*daemon), tweak);
  for (int i = 0; i < 4; ++i) allreduce_and_check(c, "before." + std::to_string(i), 1 << 20);
  ASSERT_GT(stat_of(c[0].rail_stats(), "agg").bytes_sent, 0u);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    daemon.reset();  // every connection to it closes, mid-collective
  });
  for (int i = 0; i < 12; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    allreduce_and_check(c, "during." + std::to_string(i), 1 << 20);
    // Generous bound: a lost share is redone on TCP well within a second on loopback.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0) << i;
  }
  killer.join();
  EXPECT_NE(stat_of(c[0].rail_stats(), "agg").state, "up");
  daemon = restart_daemon(address);  // the same address: the rail's probes find it again
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  int i = 0;
  while (stat_of(c[0].rail_stats(), "agg").state != "up" && std::chrono::steady_clock::now() < until)
    allreduce_and_check(c, "after." + std::to_string(i++), 1 << 18);
  EXPECT_EQ(stat_of(c[0].rail_stats(), "agg").state, "up");
  const uint64_t reduced = daemon->stats().chunks_reduced;
  for (int k = 0; k < 6; ++k) allreduce_and_check(c, "readmitted." + std::to_string(k), 1 << 20);
  EXPECT_GT(daemon->stats().chunks_reduced, reduced);
}

// The daemon dies once sums of a share have landed over part of its input (kept chunk by chunk just
// before each sum arrived): the redo on TCP starts from that kept input, and the results are exact.
TEST(EngineAgg, DaemonKilledAfterSomeSumsLandedIsRedoneFromTheKeptInput) {
  auto daemon = start_daemon();
  Cluster c(4, tcp_and_agg(*daemon), tweak);
  for (int i = 0; i < 3; ++i) allreduce_and_check(c, "warm." + std::to_string(i), 1 << 20);
  const uint64_t before = stat_of(c[0].rail_stats(), "agg").bytes_received;
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (stat_of(c[0].rail_stats(), "agg").bytes_received < before + (1u << 20) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    daemon.reset();  // a megabyte of this share's sums has landed on rank 0
    killed = true;
  });
  for (int i = 0; i < 8 && !killed; ++i) allreduce_and_check(c, "cut." + std::to_string(i), 4 << 20);
  killer.join();
  allreduce_and_check(c, "after", 4 << 20);
  EXPECT_NE(stat_of(c[0].rail_stats(), "agg").state, "up") << "the share was failed over";
}

}  // namespace
}  // namespace nezha::engine
