// ShmCollRail as a host lane (host_lane: reach kHost): connected with the whole job's addresses, each
// host's ranks form their own rail, counted among themselves in job rank order; operations run per
// host; a rank behind is named by its job rank. Ranks are threads; "hosts" are host entries.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "common/error.h"
#include "rank_threads.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {
namespace {

using testing::run_ranks;

// Job ranks 0..n-1 on the hosts named by host_of.
std::vector<std::unique_ptr<ShmCollRail>> lanes(const std::vector<std::string>& host_of) {
  const int n = static_cast<int>(host_of.size());
  std::vector<std::unique_ptr<ShmCollRail>> rails;
  for (int r = 0; r < n; ++r) {
    ShmCollRailConfig c;
    c.name = "lane";
    c.secret = "host-lane-secret";
    c.host_id = host_of[r];
    c.reduce_into = &collectives::reduce_into;
    c.chunk_bytes = 4096;
    c.small_bytes = 512;
    c.liveness_slice_ms = 20;
    c.host_lane = true;
    rails.push_back(std::make_unique<ShmCollRail>(c, r, n));
  }
  std::vector<std::string> addrs;
  for (const auto& r : rails) addrs.push_back(r->local_address());
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  return rails;
}

TEST(ShmCollHostLane, EachHostsRanksFormTheirOwnRail) {
  auto rails = lanes({"a", "b", "a", "b", "a"});
  EXPECT_EQ(rails[0]->properties().reach, RailReach::kHost);
  const std::vector<int> want_rank{0, 0, 1, 1, 2}, want_size{3, 2, 3, 2, 3};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(rails[r]->rank(), want_rank[r]) << "job rank " << r;
    EXPECT_EQ(rails[r]->size(), want_size[r]) << "job rank " << r;
  }
  EXPECT_EQ(rails[0]->host_key(rails[2]->local_address()), rails[2]->host_key(rails[4]->local_address()));
  EXPECT_NE(rails[0]->host_key(rails[1]->local_address()), rails[0]->host_key(rails[0]->local_address()));
  // Each host sums its own ranks' inputs, at the same time.
  const size_t count = 5000;
  std::vector<std::vector<float>> bufs(5);
  run_ranks(5, [&](int r) {
    bufs[r].assign(count, static_cast<float>(r + 1));
    rails[r]->start_allreduce(bufs[r].data(), bufs[r].data(), count, DataType::kFloat32, ReduceOp::kSum, 1)
        ->wait(Deadline::after_seconds(20));
  });
  for (int r = 0; r < 5; ++r) {
    const float want = r % 2 == 0 ? 1 + 3 + 5 : 2 + 4;  // host a: job ranks 0, 2, 4; host b: 1, 3
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(bufs[r][i], want) << "job rank " << r << " [" << i << "]";
  }
}

TEST(ShmCollHostLane, ARankBehindIsNamedByItsJobRank) {
  auto rails = lanes({"a", "b", "a", "b"});
  int blamed = -1;
  std::string what;
  try {  // job rank 1's lane peer is job rank 3, which never starts
    std::vector<uint8_t> buf(10000);
    rails[1]->start_broadcast(buf.data(), buf.size(), 1, 1)->wait(Deadline::after_seconds(0.3));
  } catch (const PeerError& e) {
    blamed = e.peer();
    what = e.what();
  }
  EXPECT_EQ(blamed, 3) << what;
  EXPECT_NE(what.find("rank 3"), std::string::npos) << what;
  EXPECT_NE(what.find("rail 'lane', rank 1"), std::string::npos) << what;
}

}  // namespace
}  // namespace nezha::transport
