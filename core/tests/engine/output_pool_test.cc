// Large results are reused while an engine lives, within the cap, and freed with the last engine;
// through the engine, a second allgather of the same size gets the first one's block back.
#include "engine/output_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "engine_cluster.h"

namespace nezha::engine {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(OutputPool, AGivenBackBlockServesTheNextRequestOfItsRoundedSize) {
  OutputPool& pool = OutputPool::get();
  OutputPool::Attachment engine;
  engine.start(64 * kMiB);
  const OutputPool::Stats before = pool.stats();
  void* a = pool.take(3 * kMiB + 5);
  std::memset(a, 1, 3 * kMiB + 5);
  pool.give(a, 3 * kMiB + 5);
  EXPECT_EQ(pool.stats().idle_bytes, before.idle_bytes + 4 * kMiB);  // rounded to 2 MiB granules
  void* b = pool.take(4 * kMiB);  // the same rounded size
  EXPECT_EQ(b, a);
  void* c = pool.take(4 * kMiB);  // none idle now
  EXPECT_NE(c, a);
  const OutputPool::Stats after = pool.stats();
  EXPECT_EQ(after.reused, before.reused + 1);
  EXPECT_EQ(after.allocated, before.allocated + 2);
  pool.give(b, 4 * kMiB);
  pool.give(c, 4 * kMiB);
}

TEST(OutputPool, IdleBytesStayWithinTheCapAndGoWithTheLastEngine) {
  OutputPool& pool = OutputPool::get();
  {
    OutputPool::Attachment engine;
    engine.start(8 * kMiB);
    std::vector<void*> blocks;
    for (int i = 0; i < 5; ++i) blocks.push_back(pool.take(2 * kMiB));
    for (void* p : blocks) pool.give(p, 2 * kMiB);
    EXPECT_EQ(pool.stats().idle_bytes, 8 * kMiB);  // four kept, the fifth freed
    EXPECT_EQ(pool.stats().idle_blocks, 4u);
  }
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
  // With no engine, nothing is kept.
  void* p = pool.take(2 * kMiB);
  pool.give(p, 2 * kMiB);
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
}

TEST(OutputPool, SmallResultsBypassThePoolAndTheAllocatorLeavesBytesUnset) {
  OutputPool& pool = OutputPool::get();
  OutputPool::Attachment engine;
  engine.start(64 * kMiB);
  const OutputPool::Stats before = pool.stats();
  { OutputBytes small(kMiB - 1); }
  EXPECT_EQ(pool.stats().allocated, before.allocated);
  void* seen = nullptr;
  {
    OutputBytes big(5 * kMiB);
    std::memset(big.data(), 7, big.size());
    seen = big.data();
  }
  OutputBytes again;
  again.resize(5 * kMiB);  // resize() must not zero-fill what it reuses
  EXPECT_EQ(static_cast<void*>(again.data()), seen);
  EXPECT_EQ(again[12345], 7);
}

TEST(OutputPool, ThreadsTakeAndGiveConcurrently) {
  OutputPool& pool = OutputPool::get();
  OutputPool::Attachment engine;
  engine.start(32 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t bytes = (1 + (i + t) % 3) * 2 * kMiB;
        auto* p = static_cast<uint8_t*>(pool.take(bytes));
        p[0] = static_cast<uint8_t>(t);
        p[bytes - 1] = static_cast<uint8_t>(i);
        ASSERT_EQ(p[0], t);
        pool.give(p, bytes);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(pool.stats().idle_bytes, 32 * kMiB);
}

TEST(OutputPool, ASecondAllgatherReusesTheFirstOnesFreedResult) {
  testing::Cluster c(2);
  constexpr size_t kCount = 600000;  // 2.4 MB per rank, 4.8 MB gathered
  auto run = [&](int step) {
    std::vector<std::vector<float>> in(2);
    std::vector<std::shared_ptr<OpHandle>> h(2);
    for (int r = 0; r < 2; ++r) {
      in[r].resize(kCount);
      std::iota(in[r].begin(), in[r].end(), static_cast<float>(r * 1000 + step));
      h[r] = testing::submit(c[r], testing::make_request(OpType::kAllgather, "g" + std::to_string(step),
                                                         DataType::kFloat32, {static_cast<int64_t>(kCount)}),
                             in[r].data(), nullptr);
    }
    for (int r = 0; r < 2; ++r) {
      testing::expect_ok(h[r], "allgather " + std::to_string(step) + " rank " + std::to_string(r), 60);
      const OutputBytes& out = h[r]->result().output;
      ASSERT_EQ(out.size(), 2 * kCount * sizeof(float));
      for (int q = 0; q < 2; ++q)
        ASSERT_EQ(std::memcmp(out.data() + q * kCount * sizeof(float), in[q].data(), kCount * sizeof(float)), 0)
            << "step " << step << " rank " << r << " block " << q;
    }
  };  // the handles, and their results, go here
  run(0);
  const uint64_t reused = c[0].stats().output_blocks_reused;
  run(1);
  EXPECT_GE(c[0].stats().output_blocks_reused, reused + 2);  // both ranks' results
}

}  // namespace
}  // namespace nezha::engine
