// Failover copies only where a redo could help (failover/redo_scope.h), end to end with ranks as
// threads: a job whose rails all fail only with a rank (shared memory) copies no input aside and
// fails a broken rail's operation naming the rail; a job with a rail that can fail alone beside
// another still copies and still fails over.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
constexpr double kWaitS = 20;
constexpr size_t kCount = size_t{1} << 20;  // 4 MiB: striped or balanced over two rails

float value(int rank, int step, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 7 + step) % 19) - 9); }

// `steps` in-place allreduces of kCount floats on every rank (in place: the ring overwrites the
// input, so a job with failover must keep it), each checked against the serial sum. Returns the
// handles' errors of the last step ("" each when all went well).
std::vector<std::string> allreduce_in_place(Cluster& c, int steps, const std::string& name) {
  const int n = c.size();
  std::vector<std::string> errors(n);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> buf(n, std::vector<float>(kCount));
    std::vector<std::shared_ptr<OpHandle>> h(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kCount; ++i) buf[r][i] = value(r, step, i);
      auto req = testing::make_request(OpType::kAllreduce, name + std::to_string(step), DataType::kFloat32,
                                       {static_cast<int64_t>(kCount)});
      h[r] = testing::submit(c[r], req, buf[r].data(), buf[r].data());
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(h[r]->wait_for(kWaitS)) << name << " step " << step << " rank " << r << ": not done";
      errors[r] = h[r]->error();
      if (!errors[r].empty()) continue;
      for (size_t i = 0; i < kCount; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += value(q, step, i);
        if (buf[r][i] != want) {
          ADD_FAILURE() << name << " step " << step << " rank " << r << " [" << i << "]: " << buf[r][i] << " != " << want;
          break;
        }
      }
    }
  }
  return errors;
}

uint64_t kept(Cluster& c) {
  uint64_t total = 0;
  for (int r = 0; r < c.size(); ++r) total += c[r].stats().bytes_kept_for_redo;
  return total;
}

void quiet_config(EngineConfig& cfg) {
  cfg.control_inline_bytes = 0;  // allreduces run on the rails
  cfg.control_addr = "127.0.0.1";
  cfg.timeout_s = 4;
  cfg.rail_stall_ms = 2000;  // a loaded machine: only real errors fail over
}

TEST(EngineRedoScope, RailsThatCanFailAloneKeepTheirInputs) {
  Cluster c(3, testing::memory_rails(2), quiet_config);
  allreduce_in_place(c, 3, "alone.");
  EXPECT_GT(kept(c), 0u) << "two rails that can fail alone: failover keeps every in-place input";
}

TEST(EngineRedoScope, RailsThatFailOnlyWithARankKeepNothing) {
  Cluster c(3, testing::memory_rails(2, "fails_alone=0"), quiet_config);
  allreduce_in_place(c, 3, "shared.");
  EXPECT_EQ(kept(c), 0u);
  uint64_t both = 0;  // the job really used two rails
  for (const auto& s : c[0].rail_stats()) both += s.bytes_sent > 0;
  EXPECT_EQ(both, 2u);
}

TEST(EngineRedoScope, WithoutFailoverABrokenSharedRailFailsItsOperationNamingIt) {
  std::vector<RailConfig> rails = testing::memory_rails(2, "fails_alone=0");
  // Not balanced: a balanced operation lets the rails claim ranges as they finish, and on a loaded
  // machine rail 0 may claim them all before rail 1's worker runs, so no operation touches the
  // broken rail (1 run in 15 beside a CPU hog).
  Cluster c(2, rails, [](EngineConfig& cfg) {
    quiet_config(cfg);
    cfg.balance_bytes = 0;
  });
  allreduce_in_place(c, 1, "before.");
  c[1].testing_fail_rail(1, "segment gone");
  // The planner may leave rail 1 out of a plan for a while (a calibration on a loaded machine can
  // make it look slow), but lends an idle rail a probe share every 16 large operations
  // (add_probe_shares); the first operation on it must fail, on every rank (rank 0 at its deadline
  // at the latest), naming the rail, never hang.
  std::vector<std::string> errors;
  for (int attempt = 0; attempt < 20; ++attempt) {
    errors = allreduce_in_place(c, 1, "after" + std::to_string(attempt) + ".");
    if (!errors[1].empty()) break;
  }
  EXPECT_NE(errors[1].find("failed on rail '" + rails[1].name + "'"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("segment gone"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rail '" + rails[1].name + "'"), std::string::npos) << errors[0];
  EXPECT_EQ(kept(c), 0u);
}

RailConfig shm_rail(bool automatic = false) {
  RailConfig rc{"shm", "", "shm", {{"ring_bytes", "131072"}}};
  rc.automatic = automatic;
  return rc;
}
RailConfig shmcoll_rail() { return RailConfig{"shmcoll", "", "shmcoll", {}}; }

TEST(EngineRedoScope, TheTwoSharedMemoryRailsKeepNothing) {
  Cluster c(3, {shm_rail(), shmcoll_rail()}, quiet_config);
  allreduce_in_place(c, 3, "shm.");
  EXPECT_EQ(kept(c), 0u);
}

TEST(EngineRedoScope, TheOneHostDefaultWithTheCollectiveShmRailKeepsNothing) {
  // lo with its automatic shm lane (tcp+shm) and the collective rail: the only rail that could
  // redo anything is lo itself.
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_rail(/*automatic=*/true));
  rails.push_back(shmcoll_rail());
  Cluster c(3, rails, quiet_config);
  ASSERT_EQ(c[0].rail_stats().size(), 2u);
  allreduce_in_place(c, 3, "default.");
  EXPECT_EQ(kept(c), 0u);
}

TEST(EngineRedoScope, ASocketRailBesideShmStillKeepsAndFailsOver) {
  std::vector<RailConfig> rails = testing::loopback_rails(1);
  rails.push_back(shm_rail());
  Cluster c(2, rails, quiet_config);
  allreduce_in_place(c, 2, "mixed.");
  EXPECT_GT(kept(c), 0u);
  c[1].testing_fail_rail(0, "socket closed");  // the TCP rail: its shares are redone over shm
  for (const auto& e : allreduce_in_place(c, 4, "redone.")) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace nezha::engine
