// Not a test: the measurement behind ShmRailConfig's ring_bytes / chunk_bytes defaults. Four forked
// processes allreduce float32 over ShmRails of each (ring, chunk) setting and print the median time.
// Run: nezha_collectives_tests --gtest_also_run_disabled_tests --gtest_filter='*ShmRingSweep*'
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "transport/shm_process_job.h"

namespace nezha::collectives {
namespace {

TEST(ShmRingSweep, DISABLED_AllreduceTimesPerRingAndChunk) {
  const int n = 4;
  const std::vector<size_t> sizes{8, 64 << 10, 1 << 20, 64 << 20};
  const std::vector<std::pair<size_t, size_t>> settings{
      {1 << 20, 64 << 10}, {1 << 20, 256 << 10}, {2 << 20, 256 << 10}, {4 << 20, 256 << 10},
      {4 << 20, 1 << 20}, {8 << 20, 512 << 10}};
  for (const auto& [ring, chunk] : settings) {
    transport::ShmRailConfig config;
    config.secret = "sweep";
    config.ring_bytes = ring;
    config.chunk_bytes = chunk;
    transport::testing::ProcessJob job(n, [&](transport::ShmRail& rail) -> std::string {
      std::string line;
      for (size_t bytes : sizes) {
        std::vector<float> buf(bytes / 4, 1.0f);
        const int iters = bytes >= (64 << 20) ? 5 : 50;
        std::vector<double> us;
        for (int i = 0; i < iters + 2; ++i) {
          CollectiveOptions opt;
          opt.seq = static_cast<uint64_t>(i + 1);
          opt.deadline = Deadline::after_seconds(60);
          const auto t = Clock::now();
          allreduce(rail, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, opt);
          if (i >= 2) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
        }
        std::sort(us.begin(), us.end());
        char cell[64];
        std::snprintf(cell, sizeof cell, " %zuB=%.0fus", bytes, us[us.size() / 2]);
        line += cell;
      }
      return line;
    }, config);
    std::printf("ring %zu KiB chunk %zu KiB: rank0%s\n", ring >> 10, chunk >> 10, job.result(0).c_str());
    for (int r = 1; r < n; ++r) job.result(r);
  }
}

}  // namespace
}  // namespace nezha::collectives
