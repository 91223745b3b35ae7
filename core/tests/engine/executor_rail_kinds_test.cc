// The executor asks each rail its kind (transport/rail.h): an allreduce share planned on a collective
// rail is reduced by that rail, one on a point-to-point rail runs the algorithms, and an operation a
// collective rail does not run (the rail table never plans one) fails naming the rail instead of
// reaching an algorithm. Two ranks as threads, an in-memory rail beside a threads-sum collective rail.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../collectives/memory_rail.h"
#include "../collectives/thread_sum_rail.h"
#include "engine/execution/executor.h"

namespace nezha::engine {
namespace {

constexpr int kRanks = 2;
constexpr size_t kCount = 10000;

struct Job {
  testing::MemoryWorld world{kRanks, "mem"};
  testing::SharedSum sum{kRanks};
  std::vector<std::unique_ptr<testing::ThreadSumRail>> collective;
  std::vector<std::unique_ptr<Executor>> ex;

  Job() {
    for (int r = 0; r < kRanks; ++r) {
      collective.push_back(std::make_unique<testing::ThreadSumRail>(sum, r, kRanks, 0));
      ExecutorOptions o;
      o.rank = r;
      o.size = kRanks;
      o.timeout_s = 10;
      ex.push_back(std::make_unique<Executor>(
          o, std::vector<transport::Rail*>{&world.rail(r), collective.back().get()}, nullptr, ShareObserver{}));
    }
  }
};

// Runs `resp` on every rank over data[r] in place; returns each rank's handle once done.
std::vector<std::shared_ptr<OpHandle>> run(Job& job, const Response& resp, std::vector<std::vector<float>>& data) {
  std::vector<std::shared_ptr<OpHandle>> h(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    TensorEntry e;
    e.req.type = resp.type;
    e.req.name = resp.names[0];
    e.req.dtype = resp.dtype;
    e.req.op = resp.op;
    e.req.shape = {static_cast<int64_t>(kCount)};
    e.req.root = resp.root;
    e.input = e.output = data[r].data();
    e.handle = h[r] = std::make_shared<OpHandle>();
    std::vector<TensorEntry> entries;
    entries.push_back(std::move(e));
    job.ex[r]->execute(resp, std::move(entries));
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(h[r]->wait_for(20)) << "rank " << r << " never finished";
  return h;
}

Response planned(OpType type, std::vector<multirail::RailShare> plan) {
  Response resp;
  resp.kind = Response::Kind::kExecute;
  resp.type = type;
  resp.names = {"t"};
  resp.counts = {static_cast<int64_t>(kCount)};
  resp.dtype = DataType::kFloat32;
  resp.op = ReduceOp::kSum;
  resp.root = 0;
  resp.plan = std::move(plan);
  return resp;
}

TEST(ExecutorRailKinds, AnAllreduceStripedOverBothKindsIsExactAndTheCollectiveRailReducesItsShare) {
  Job job;
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(kCount));
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < kCount; ++i) data[r][i] = static_cast<float>(r * 100 + static_cast<int>(i % 50));
  const size_t half = kCount / 2;
  auto h = run(job, planned(OpType::kAllreduce, {{0, 0, half}, {1, half, kCount - half}}), data);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(h[r]->error(), "") << "rank " << r;
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(data[r][i], static_cast<float>(100 + 2 * static_cast<int>(i % 50))) << "rank " << r << " [" << i << "]";
    // The collective rail carried exactly its share; the memory rail carried the other half.
    EXPECT_EQ(job.collective[r]->counters().bytes_sent, (kCount - half) * sizeof(float)) << "rank " << r;
  }
  EXPECT_GT(job.world.rail(0).counters().bytes_sent, 0u);
}

TEST(ExecutorRailKinds, ABroadcastGivenToACollectiveRailFailsNamingItAndMovesNothing) {
  Job job;
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(kCount, 0.0f));
  for (size_t i = 0; i < kCount; ++i) data[0][i] = static_cast<float>(i);
  auto h = run(job, planned(OpType::kBroadcast, {{1, 0, kCount}}), data);
  for (int r = 0; r < kRanks; ++r) {
    const std::string error = h[r]->error();
    EXPECT_NE(error.find("rail 'threadsum' cannot run a broadcast"), std::string::npos) << "rank " << r << ": " << error;
    EXPECT_NE(error.find("broadcast"), std::string::npos) << "rank " << r << ": " << error;
    EXPECT_EQ(job.collective[r]->counters().bytes_sent, 0u) << "rank " << r;
  }
  EXPECT_EQ(data[1][1], 0.0f);  // nothing arrived
}

}  // namespace
}  // namespace nezha::engine
