// The ring's pipelined schedule (message i+1 sent while message i is received) against its lock-step
// schedule: the same bits, on in-memory rails and on TCP, and no deadlock when the socket buffers
// are too small to pipeline.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "rank_harness.h"
#include "transport/tcp/tcp_rail.h"

namespace nezha::collectives {
namespace {

using nezha::testing::run_ranks;
using nezha::testing::test_options;

std::vector<std::vector<float>> random_inputs(int size, size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<std::vector<float>> in(static_cast<size_t>(size), std::vector<float>(count));
  for (auto& v : in)
    for (float& x : v) x = dist(gen);
  return in;
}

// Allreduce over in-memory rails that claim `send_buffer_bytes` of buffering.
std::vector<std::vector<float>> allreduce_in_memory(const std::vector<std::vector<float>>& inputs,
                                                    size_t segment_bytes, size_t send_buffer_bytes) {
  auto bufs = inputs;
  const int size = static_cast<int>(bufs.size());
  run_ranks(
      size,
      [&](transport::PointToPointRail& rail) {
        auto& b = bufs[static_cast<size_t>(rail.rank())];
        allreduce_ring(rail, b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum,
                       test_options(/*seq=*/5, segment_bytes));
      },
      send_buffer_bytes);
  return bufs;
}

void expect_close_to_double_sum(const std::vector<std::vector<float>>& inputs,
                                const std::vector<float>& result) {
  for (size_t i = 0; i < result.size(); i += 997) {
    double sum = 0;
    for (const auto& v : inputs) sum += v[i];
    ASSERT_NEAR(result[i], sum, 1e-3 * (1 + std::abs(sum))) << "element " << i;
  }
}

TEST(RingPipeline, PipelinedAndLockStepRingsGiveTheSameBitsOnEveryRank) {
  // Odd count: uneven blocks and a short last segment; 64 KiB segments: many per block.
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(size));
    const auto inputs = random_inputs(size, 300001, 11 + size);
    const auto pipelined = allreduce_in_memory(inputs, 64 << 10, SIZE_MAX);
    const auto lock_step = allreduce_in_memory(inputs, 64 << 10, 0);
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(std::memcmp(pipelined[r].data(), lock_step[0].data(), 300001 * sizeof(float)), 0)
          << "rank " << r;
    }
    expect_close_to_double_sum(inputs, pipelined[0]);
  }
}

TEST(RingPipeline, AllgatherPipelinedMatchesTheBlocksOfEveryRank) {
  const int size = 4;
  const std::vector<size_t> blocks = {70000, 0, 123457, 4096};
  std::vector<size_t> offsets{0};
  for (size_t b : blocks) offsets.push_back(offsets.back() + b);
  std::vector<std::vector<uint8_t>> bufs(size, std::vector<uint8_t>(offsets.back()));
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < blocks[r]; ++i) bufs[r][offsets[r] + i] = static_cast<uint8_t>(i * 7 + r);
  run_ranks(size, [&](transport::PointToPointRail& rail) {
    uint8_t* out = bufs[rail.rank()].data();
    allgatherv(rail, out + offsets[rail.rank()], out, blocks, test_options(/*seq=*/9, 8 << 10));
  });
  for (int r = 0; r < size; ++r)
    for (int owner = 0; owner < size; ++owner)
      for (size_t i = 0; i < blocks[owner]; i += 101)
        ASSERT_EQ(bufs[r][offsets[owner] + i], static_cast<uint8_t>(i * 7 + owner))
            << "rank " << r << " block " << owner << " byte " << i;
}

// Allreduce over a loopback TCP mesh whose sockets buffer about socket_buffer_bytes.
std::vector<std::vector<float>> allreduce_over_tcp(const std::vector<std::vector<float>>& inputs,
                                                   size_t segment_bytes, size_t socket_buffer_bytes,
                                                   size_t* reported_buffer) {
  const int size = static_cast<int>(inputs.size());
  transport::TcpRailConfig config;
  config.name = "lo";
  config.local_addr = "127.0.0.1";
  config.secret = "ring-pipeline-test";
  config.socket_buffer_bytes = socket_buffer_bytes;
  std::vector<std::unique_ptr<transport::TcpRail>> rails;
  std::vector<std::string> addrs;
  for (int r = 0; r < size; ++r) {
    rails.push_back(std::make_unique<transport::TcpRail>(config, r, size));
    addrs.push_back(rails.back()->local_address());
  }
  auto bufs = inputs;
  const Deadline connect = Deadline::after_seconds(10);
  run_ranks(size, [&](transport::PointToPointRail& mem) {
    auto& rail = *rails[static_cast<size_t>(mem.rank())];
    rail.connect(addrs, connect);
    auto& b = bufs[static_cast<size_t>(rail.rank())];
    allreduce_ring(rail, b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum,
                   test_options(/*seq=*/6, segment_bytes));
  });
  *reported_buffer = rails[0]->send_buffer_bytes();
  return bufs;
}

TEST(RingPipeline, OverTcpPipelinesWithLargeBuffersAndFallsBackWithoutDeadlockOnSmallOnes) {
  const int size = 3;
  const size_t count = (3 << 20) / 4 + 5;  // 3 MiB + a few floats: several 256 KiB segments per block
  const auto inputs = random_inputs(size, count, 3);
  size_t large_buffer = 0, small_buffer = 0;
  const auto pipelined = allreduce_over_tcp(inputs, 256 << 10, 4 << 20, &large_buffer);
  // 16 KiB socket buffers cannot hold a 256 KiB segment: pipelining could deadlock, so the ring
  // must see that (send_buffer_bytes) and run lock-step; a deadlock would fail on the deadline.
  const auto lock_step = allreduce_over_tcp(inputs, 256 << 10, 16 << 10, &small_buffer);
  EXPECT_LT(small_buffer, size_t{256} << 10);
  // The kernel may cap SO_SNDBUF (net.core.wmem_max); only claim pipelining where it allowed it.
  if (large_buffer < (size_t{256} << 10)) {
    GTEST_LOG_(INFO) << "socket buffers capped at " << large_buffer << " bytes: no pipelining here";
  }
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(std::memcmp(pipelined[r].data(), lock_step[0].data(), count * sizeof(float)), 0)
        << "rank " << r;
  }
  expect_close_to_double_sum(inputs, pipelined[0]);
}

}  // namespace
}  // namespace nezha::collectives
