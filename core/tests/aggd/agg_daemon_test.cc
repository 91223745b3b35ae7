// nezha-aggd in-process on loopback, ranks as threads: every dtype x op against a serial reference,
// bit-identical float sums in rank order, several chunks and the window, two jobs at once, a rank
// whose count differs, a job whose rank vanished freed after the timeout, in-place chunks offered
// for saving (failover) just before their sums land.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "aggd/agg_cluster.h"
#include "collectives/collectives.h"
#include "collectives/typed_values.h"
#include "common/error.h"

namespace nezha::aggd {
namespace {

using testing::connect_all;
using testing::make_job;
using testing::start_daemon;
using transport::testing::run_ranks;

double reference(ReduceOp op, DataType t, const std::vector<double>& v) {
  double acc = v[0];
  for (size_t i = 1; i < v.size(); ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc = t == DataType::kBool ? (acc != 0 || v[i] != 0) : acc + v[i]; break;
      case ReduceOp::kMin: acc = std::min(acc, v[i]); break;
      case ReduceOp::kMax: acc = std::max(acc, v[i]); break;
      case ReduceOp::kProduct: acc = t == DataType::kBool ? (acc != 0 && v[i] != 0) : acc * v[i]; break;
    }
  }
  return acc;
}

// Small integers (every dtype holds them and their 4-rank sums and products exactly).
double input_value(int rank, size_t i, DataType t) {
  if (t == DataType::kBool) return ((i + static_cast<size_t>(rank)) % 3) == 0;
  return static_cast<double>(1 + (i * 7 + static_cast<size_t>(rank) * 3) % 3);
}

TEST(AggDaemon, EveryDtypeAndOpMatchesTheSerialReference) {
  auto daemon = start_daemon();
  const int n = 4;
  auto job = make_job(*daemon, n);
  connect_all(job);
  const size_t count = 3000;  // several 4 KiB chunks for the wide types, a short last chunk
  uint64_t seq = 0;
  for (int ti = 0; ti <= static_cast<int>(DataType::kInt16); ++ti) {
    const DataType t = static_cast<DataType>(ti);
    for (int oi = 0; oi < kNumReduceOps; ++oi) {
      const ReduceOp op = static_cast<ReduceOp>(oi);
      std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(count * dtype_size(t)));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) nezha::testing::store_value(t, bufs[r].data(), i, input_value(r, i, t));
      run_ranks(n, [&](int r) {
        job.rails[r]->start_allreduce(bufs[r].data(), bufs[r].data(), count, t, op, seq)->wait(Deadline::after_seconds(10));
      });
      ++seq;
      for (size_t i = 0; i < count; ++i) {
        std::vector<double> v;
        for (int r = 0; r < n; ++r) v.push_back(input_value(r, i, t));
        const double want = reference(op, t, v);
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(nezha::testing::load_value(t, bufs[r].data(), i), want)
              << dtype_name(t) << " " << reduce_op_name(op) << " element " << i << " rank " << r;
      }
    }
  }
}

TEST(AggDaemon, Float32SumsInRankOrderBitIdenticalOnEveryRank) {
  auto daemon = start_daemon();
  const int n = 3;
  auto job = make_job(*daemon, n, "daemon-key", 8192, 2);
  connect_all(job);
  const size_t count = 50000;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(count));
  for (auto& v : in)
    for (auto& x : v) x = dist(gen);
  run_ranks(n, [&](int r) {  // separate output buffers: input and output need not alias
    job.rails[r]->start_allreduce(in[r].data(), out[r].data(), count, DataType::kFloat32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(10));
  });
  for (size_t i = 0; i < count; ++i) {
    const float want = (in[0][i] + in[1][i]) + in[2][i];  // rank order, as the daemon promises
    for (int r = 0; r < n; ++r) ASSERT_EQ(std::memcmp(&out[r][i], &want, sizeof want), 0) << "element " << i;
  }
}

// In place, the rail hands each chunk's range to before_overwrite just before that chunk's sum lands
// (the engine keeps the input there for a redo): in order, each once, while it still holds the input.
TEST(AggDaemon, InPlaceEachChunkIsOfferedForSavingBeforeItsSumLands) {
  auto daemon = start_daemon();
  const int n = 2;
  auto job = make_job(*daemon, n, "daemon-key", 4096, 2);
  connect_all(job);
  const size_t count = 10 * 1024 + 77;  // 10 whole chunks of 1024 floats and a short one
  std::vector<std::vector<float>> buf(n, std::vector<float>(count)), saved(n, std::vector<float>(count, -1.0f));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) buf[r][i] = static_cast<float>(i % 1000 + r);
  const std::vector<std::vector<float>> original = buf;
  std::vector<std::vector<std::pair<size_t, size_t>>> offered(n);
  std::vector<int> still_input(n, 1);
  run_ranks(n, [&](int r) {
    auto keep = [&, r](size_t offset, size_t bytes) {
      const auto* now = reinterpret_cast<const uint8_t*>(buf[r].data()) + offset;
      if (std::memcmp(now, reinterpret_cast<const uint8_t*>(original[r].data()) + offset, bytes) != 0) still_input[r] = 0;
      std::memcpy(reinterpret_cast<uint8_t*>(saved[r].data()) + offset, now, bytes);
      offered[r].push_back({offset, bytes});
    };
    job.rails[r]->start_allreduce(buf[r].data(), buf[r].data(), count, DataType::kFloat32, ReduceOp::kSum, 0, keep)
        ->wait(Deadline::after_seconds(10));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(still_input[r]) << "rank " << r << ": a range was offered after its sum had landed";
    ASSERT_EQ(offered[r].size(), 11u) << "rank " << r << ": one range per chunk";
    size_t next = 0;
    for (const auto& [offset, bytes] : offered[r]) {
      EXPECT_EQ(offset, next) << "rank " << r << ": ranges in chunk order, no gap";
      next = offset + bytes;
    }
    EXPECT_EQ(next, count * sizeof(float));
    EXPECT_EQ(saved[r], original[r]) << "rank " << r << ": what was kept is the input";
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[r][i], original[0][i] + original[1][i]) << "element " << i;
  }
}

TEST(AggDaemon, EmptyAndOneRankAllreduces) {
  auto daemon = start_daemon();
  auto one = make_job(*daemon, 1);
  connect_all(one);
  std::vector<int32_t> v = {5, -2, 9};
  one.rails[0]->start_allreduce(v.data(), v.data(), 3, DataType::kInt32, ReduceOp::kSum, 0)->wait(Deadline::after_seconds(5));
  EXPECT_EQ(v, (std::vector<int32_t>{5, -2, 9}));
  auto two = make_job(*daemon, 2);
  connect_all(two);
  run_ranks(2, [&](int r) {
    two.rails[r]->start_allreduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum, 0)->wait(Deadline::after_seconds(5));
  });
}

TEST(AggDaemon, TwoJobsAtOnceStayIsolated) {
  auto daemon = start_daemon();
  const int n = 3;
  auto a = make_job(*daemon, n), b = make_job(*daemon, n);
  connect_all(a);
  connect_all(b);
  const size_t count = 20000;
  std::vector<std::vector<int64_t>> va(n, std::vector<int64_t>(count)), vb(n, std::vector<int64_t>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      va[r][i] = static_cast<int64_t>(i) + r;
      vb[r][i] = 1000000 + static_cast<int64_t>(i) * (r + 1);
    }
  run_ranks(2 * n, [&](int t) {  // both jobs' ranks interleave on the daemon, same seq numbers
    auto& job = t < n ? a : b;
    auto& v = t < n ? va : vb;
    const int r = t % n;
    for (uint64_t s = 0; s < 3; ++s)  // three allreduces each: sums of sums
      job.rails[r]->start_allreduce(v[r].data(), v[r].data(), count, DataType::kInt64, ReduceOp::kSum, s)
          ->wait(Deadline::after_seconds(20));
  });
  for (size_t i = 0; i < count; ++i) {
    // Each round every rank gets the sum; after 3 rounds: n^2 * (sum of inputs).
    const int64_t sa = 3 * static_cast<int64_t>(i) + 3, sb = 3000000 + 6 * static_cast<int64_t>(i);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(va[r][i], sa * n * n) << i;
      ASSERT_EQ(vb[r][i], sb * n * n) << i;
    }
  }
  EXPECT_EQ(daemon->stats().job_errors, 0u);
}

TEST(AggDaemon, CountMismatchFailsThatJobOnlyNamingTheRanks) {
  auto daemon = start_daemon();
  auto bad = make_job(*daemon, 2), good = make_job(*daemon, 2);
  connect_all(bad);
  connect_all(good);
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> buf(2, std::vector<float>(4096, 1.0f));
  run_ranks(2, [&](int r) {
    try {
      bad.rails[r]->start_allreduce(buf[r].data(), buf[r].data(), r == 0 ? 1000 : 1001, DataType::kFloat32,
                                    ReduceOp::kSum, 0)->wait(Deadline::after_seconds(10));
    } catch (const PeerError& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("nezha-aggd"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 0 sent 1000"), std::string::npos) << e;
  }
  std::vector<std::vector<float>> g(2, std::vector<float>(5000, 2.0f));
  run_ranks(2, [&](int r) {
    good.rails[r]->start_allreduce(g[r].data(), g[r].data(), 5000, DataType::kFloat32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(10));
  });
  for (auto& v : g)
    for (float x : v) ASSERT_EQ(x, 4.0f);
  EXPECT_EQ(daemon->stats().job_errors, 1u);
}

TEST(AggDaemon, ARankThatVanishesFreesItsJobAfterTheTimeout) {
  auto daemon = start_daemon("daemon-key", size_t{256} << 20, /*job_timeout_s=*/1.0);
  auto job = make_job(*daemon, 2);
  connect_all(job);
  const size_t reserved = daemon->stats().reserved_bytes;
  EXPECT_GT(reserved, 0u);
  std::vector<float> v(100, 1.0f);
  // Rank 0 contributes and waits; rank 1 disappears without contributing.
  job.rails[1]->close();
  std::string error;
  try {
    job.rails[0]->start_allreduce(v.data(), v.data(), 100, DataType::kFloat32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(10));
  } catch (const PeerError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("rank 1 disconnected"), std::string::npos) << error;
  EXPECT_EQ(daemon->stats().reserved_bytes, 0u);
}

TEST(AggDaemon, ReconnectAtANewEpochStartsTheJobAfresh) {
  auto daemon = start_daemon();
  auto job = make_job(*daemon, 2);
  connect_all(job);
  std::vector<std::vector<int32_t>> v(2, std::vector<int32_t>(10, 3));
  run_ranks(2, [&](int r) {
    job.rails[r]->start_allreduce(v[r].data(), v[r].data(), 10, DataType::kInt32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(5));
  });
  for (auto& r : job.rails) r->reset();  // failover re-admission: every rank resets, then connects
  connect_all(job);
  run_ranks(2, [&](int r) {
    job.rails[r]->start_allreduce(v[r].data(), v[r].data(), 10, DataType::kInt32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(5));
  });
  for (auto& x : v)
    for (int32_t e : x) ASSERT_EQ(e, 12);
}

}  // namespace
}  // namespace nezha::aggd
