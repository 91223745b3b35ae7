// What an aggregation rail tells the watchdog about its health (Rail::link_fault, Rail::delivering):
// a rank whose chunks wait at the daemon for a late peer is silent but delivering (the daemon's host
// acknowledged all it sent), so a starved peer is not taken for a cut path.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "aggd/agg_cluster.h"
#include "common/error.h"

namespace nezha::aggd {
namespace {

using std::chrono::milliseconds;
using testing::connect_all;
using testing::make_job;
using testing::start_daemon;

TEST(AggRailHealth, AnUnconnectedRailVouchesForNothingAndAJoinedOneDelivers) {
  auto daemon = start_daemon();
  auto job = make_job(*daemon, 2);
  EXPECT_FALSE(job.rails[0]->delivering(milliseconds(50))) << "not connected: nothing to vouch for";
  EXPECT_EQ(job.rails[0]->link_fault(), "");
  connect_all(job);
  EXPECT_TRUE(job.rails[0]->delivering(milliseconds(50))) << "joined and idle";
  EXPECT_EQ(job.rails[0]->link_fault(), "") << "loopback is up";
  job.rails[0]->close();
  EXPECT_FALSE(job.rails[0]->delivering(milliseconds(50))) << "closed";
}

TEST(AggRailHealth, ARankWaitingAtTheDaemonForALatePeerIsSilentButDelivers) {
  auto daemon = start_daemon();
  auto job = make_job(*daemon, 2, "daemon-key", /*chunk_bytes=*/4096, /*window=*/4);
  connect_all(job);
  const size_t count = 64 * 1024;  // 64 chunks of 1024 floats: rank 0 sends its window, then waits
  std::vector<std::vector<float>> data(2, std::vector<float>(count));
  for (int r = 0; r < 2; ++r) std::iota(data[r].begin(), data[r].end(), static_cast<float>(r));
  auto early = job.rails[0]->start_allreduce(data[0].data(), data[0].data(), count, DataType::kFloat32,
                                             ReduceOp::kSum, 0);
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(early->test()) << "rank 1 has sent nothing: no sum can come back";
    std::this_thread::sleep_for(milliseconds(10));
  }
  const uint64_t stuck_at = job.rails[0]->counters().bytes_sent;
  EXPECT_GT(stuck_at, 0u);
  std::this_thread::sleep_for(milliseconds(150));
  EXPECT_FALSE(early->test());
  EXPECT_EQ(job.rails[0]->counters().bytes_sent, stuck_at) << "the window is full: rank 0 is silent";
  EXPECT_EQ(job.rails[0]->counters().bytes_received, 0u);
  EXPECT_TRUE(job.rails[0]->delivering(milliseconds(50))) << "everything sent was acknowledged";

  // The late rank arrives: both finish, exactly.
  std::thread late([&] {
    job.rails[1]->start_allreduce(data[1].data(), data[1].data(), count, DataType::kFloat32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(10));
  });
  early->wait(Deadline::after_seconds(10));
  late.join();
  for (size_t i = 0; i < count; i += 997) {
    const float want = static_cast<float>(i) + static_cast<float>(i + 1);
    ASSERT_EQ(data[0][i], want) << "element " << i;
    ASSERT_EQ(data[1][i], want) << "element " << i;
  }
}

}  // namespace
}  // namespace nezha::aggd
