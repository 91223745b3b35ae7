// The CUDA IPC lane (cuda/cuda_ipc_lane.h) with ranks as processes on GPU 0: results against the CPU
// kernels' serial rank-order reduction, bit-identical on every rank, for 2-4 ranks, sizes from 8 B
// to 64 MB (more than the workspace: several chunks), every dtype and op; a rank killed mid-operation
// named by the others; a mismatched operation named; nothing left in /dev/shm. Skips (GTEST_SKIP)
// where there is no CUDA driver or no GPU. The first tests need neither.
#include <dirent.h>
#include <signal.h>

#include <cstring>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "collectives/half.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "cuda/cuda_ipc_lane.h"
#include "cuda/kernel_image.h"
#include "cuda/cuda_ranks.h"
#include "transport/dev_shm_entries.h"

namespace nezha::cuda {
namespace {

using testing::CudaRank;
using testing::report;
using testing::run_ranks;

constexpr double kJobTimeoutS = 120;

using transport::testing::dev_shm_entries;

#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    static const std::string why = testing::cuda_unavailable();                   \
    if (!why.empty()) GTEST_SKIP() << "no usable CUDA GPU here: " << why;         \
  } while (0)

// Rank r's input: small integers in the dtype, so every op stays finite and exact enough to compare
// bits (the CPU template test covers NaN, inf and rounding).
std::vector<uint8_t> input_bytes(DataType dtype, int rank, size_t count) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 + i / 5) % 19) - 9;
    uint8_t* p = out.data() + i * dtype_size(dtype);
    auto put = [p](auto x) { std::memcpy(p, &x, sizeof x); };
    switch (dtype) {
      case DataType::kUInt8: put(static_cast<uint8_t>(v + 9)); break;
      case DataType::kInt8: put(static_cast<int8_t>(v)); break;
      case DataType::kInt16: put(static_cast<int16_t>(v * 300)); break;
      case DataType::kUInt16: put(static_cast<uint16_t>((v + 9) * 300)); break;
      case DataType::kInt32: put(static_cast<int32_t>(v * 100000)); break;
      case DataType::kInt64: put(static_cast<int64_t>(v) * 10000000000LL); break;
      case DataType::kFloat16: put(collectives::float_to_half(v * 0.3f)); break;
      case DataType::kBFloat16: put(collectives::float_to_bfloat16(v * 0.3f)); break;
      case DataType::kFloat32: put(v * 0.1f + 0.05f); break;
      case DataType::kFloat64: put(v * 0.1 + 0.05); break;
      case DataType::kBool: put(static_cast<uint8_t>(v > 0 ? v : 0)); break;
    }
  }
  return out;
}

// The CPU's answer: rank 0's input, reduce_into each next rank's, then the scale.
std::vector<uint8_t> reference(DataType dtype, ReduceOp op, int ranks, size_t count, double postscale) {
  std::vector<uint8_t> acc = input_bytes(dtype, 0, count);
  for (int r = 1; r < ranks; ++r) collectives::reduce_into(acc.data(), input_bytes(dtype, r, count).data(), count, dtype, op);
  const double factor = op == ReduceOp::kAverage ? postscale / ranks : postscale;
  if (dtype != DataType::kBool) collectives::scale(acc.data(), count, dtype, factor);
  return acc;
}

uint64_t digest(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

struct Allreduce {
  size_t count;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool in_place = false;
  double postscale = 1.0;
  double timeout_s = 60;
};

// One rank's job: connect, run the allreduces, compare each with the reference; reports "ok" and one
// digest per allreduce, or what went wrong. Exit 0: ok; 1: wrong result; 2: an exception (reported
// with its type and peer).
int lane_job(int rank, const std::string& dir, int size, CudaIpcLaneConfig config, const std::vector<Allreduce>& ops) {
  std::string out = "ok";
  try {
    CudaRank cr = CudaRank::open();
    CudaIpcLane lane(config, rank, size);
    const Deadline deadline = Deadline::after_seconds(60);
    lane.connect(testing::exchange_addresses(dir, rank, size, lane.local_address(), deadline), deadline);
    uint64_t seq = 0;
    for (const Allreduce& a : ops) {
      const size_t bytes = a.count * dtype_size(a.dtype);
      const std::vector<uint8_t> in = input_bytes(a.dtype, rank, a.count);
      const CudaDriver::DevicePtr d_in = cr.alloc(bytes);
      const CudaDriver::DevicePtr d_out = a.in_place ? d_in : cr.alloc(bytes);
      cr.upload(d_in, in.data(), bytes);
      lane.allreduce(d_in, d_out, a.count, a.dtype, a.op, cr.stream, seq++, Deadline::after_seconds(a.timeout_s),
                     a.postscale);
      std::vector<uint8_t> got(bytes);
      cr.download(got.data(), d_out, bytes);
      cr.cuda->mem_free(d_in);
      if (!a.in_place) cr.cuda->mem_free(d_out);
      const std::vector<uint8_t> want = reference(a.dtype, a.op, size, a.count, a.postscale);
      if (got != want) {
        size_t at = 0;
        while (got[at] == want[at]) ++at;
        report(dir, rank, "allreduce #" + std::to_string(seq - 1) + " (" + dtype_name(a.dtype) + " " +
                              reduce_op_name(a.op) + ", " + std::to_string(a.count) + " elements) differs from the "
                              "CPU reference at byte " + std::to_string(at));
        return 1;
      }
      out += " " + std::to_string(digest(got));
    }
    lane.close();
  } catch (const PeerError& e) {
    const char* type = dynamic_cast<const TimeoutError*>(&e) ? "TimeoutError(" : "PeerError(";
    report(dir, rank, type + std::to_string(e.peer()) + "): " + e.what());
    return 2;
  } catch (const ProtocolError& e) {
    report(dir, rank, std::string("ProtocolError: ") + e.what());
    return 2;
  } catch (const std::exception& e) {
    report(dir, rank, std::string("exception: ") + e.what());
    return 2;
  }
  report(dir, rank, out);
  return 0;
}

CudaIpcLaneConfig test_config() {
  CudaIpcLaneConfig c;
  c.secret = "cuda-ipc-lane-test-" + std::to_string(::getpid());
  return c;
}

void expect_all_ok_and_identical(const std::vector<testing::RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].report;
    EXPECT_EQ(outcomes[r].report, outcomes[0].report) << "rank " << r << " differs from rank 0 (bits or status)";
  }
}

TEST(CudaIpcLaneSetup, KernelImageIsEmbedded) {
  // A fatbin starts with its magic 0xBA55ED50 (little-endian).
  ASSERT_GT(kReduceKernelsImageSize, 1024u);
  uint32_t magic = 0;
  std::memcpy(&magic, kReduceKernelsImage, 4);
  EXPECT_EQ(magic, 0xBA55ED50u);
}

TEST(CudaIpcLaneSetup, RejectsBadConfiguration) {
  EXPECT_THROW(CudaIpcLane(test_config(), 2, 2), InvalidArgument);
  EXPECT_THROW(CudaIpcLane(test_config(), 0, kMaxReduceRanks + 1), InvalidArgument);
  CudaIpcLaneConfig odd = test_config();
  odd.chunk_bytes = 5000;
  EXPECT_THROW(CudaIpcLane(odd, 0, 2), InvalidArgument);
  CudaIpcLaneConfig no_slots = test_config();
  no_slots.slots = 0;
  EXPECT_THROW(CudaIpcLane(no_slots, 0, 2), InvalidArgument);
}

TEST(CudaIpcLaneSetup, RefusesWorkBeforeConnect) {
  CudaIpcLane lane(test_config(), 0, 2);
  EXPECT_THROW(lane.allreduce(1024, 1024, 4, DataType::kFloat32, ReduceOp::kSum, nullptr, 0, Deadline::after_seconds(1)),
               NezhaError);
  EXPECT_THROW(lane.allreduce(1024, 1024, 4, DataType::kBool, ReduceOp::kAverage, nullptr, 0, Deadline::after_seconds(1)),
               InvalidArgument);
  EXPECT_THROW(lane.connect({lane.local_address()}, Deadline::after_seconds(1)), InvalidArgument);  // 1 address, 2 ranks
}

class CudaIpcLaneRanks : public ::testing::TestWithParam<int> {};

TEST_P(CudaIpcLaneRanks, SizesFrom8BytesTo64MB) {
  SKIP_WITHOUT_GPU();
  const int ranks = GetParam();
  const auto before = dev_shm_entries();
  // 8 B, an odd count (whole), an odd count (sliced), 1 MB in place, 64 MB (two 16 MB slots: 4 chunks).
  const std::vector<Allreduce> ops = {{2}, {12345}, {100003}, {262144, DataType::kFloat32, ReduceOp::kSum, true},
                                      {16 << 20}};
  CudaIpcLaneConfig config = test_config();
  config.chunk_bytes = 16 << 20;
  expect_all_ok_and_identical(
      run_ranks(ranks, [&](int r, const std::string& dir) { return lane_job(r, dir, ranks, config, ops); }, kJobTimeoutS));
  EXPECT_EQ(dev_shm_entries(), before) << "the lane left something in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(, CudaIpcLaneRanks, ::testing::Values(2, 4), [](const auto& info) {
  return std::to_string(info.param) + "ranks";
});

TEST(CudaIpcLane, EveryDtypeAndOpWholeAndSliced) {
  SKIP_WITHOUT_GPU();
  std::vector<Allreduce> ops;
  for (int d = 0; d < kNumDataTypes; ++d)
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto dtype = static_cast<DataType>(d);
      const auto op = static_cast<ReduceOp>(o);
      if (dtype == DataType::kBool && op == ReduceOp::kAverage) continue;
      ops.push_back({1001, dtype, op});          // whole: every rank reduces everything
      ops.push_back({50001, dtype, op, d % 2 == 0});  // sliced over 64 KB chunks
    }
  ops.push_back({16384 + 3, DataType::kFloat32, ReduceOp::kMax});  // a last chunk of 3: two ranks' slices empty
  ops.push_back({30001, DataType::kFloat32, ReduceOp::kSum, false, 0.125});  // postscale
  ops.push_back({30001, DataType::kInt32, ReduceOp::kAverage, false, 1.0});  // integer average truncates
  CudaIpcLaneConfig config = test_config();
  config.chunk_bytes = 64 << 10;
  config.slots = 3;
  config.small_bytes = 16 << 10;
  expect_all_ok_and_identical(
      run_ranks(3, [&](int r, const std::string& dir) { return lane_job(r, dir, 3, config, ops); }, kJobTimeoutS));
}

TEST(CudaIpcLane, KilledRankIsNamedByTheOthers) {
  SKIP_WITHOUT_GPU();
  const auto before = dev_shm_entries();
  CudaIpcLaneConfig config = test_config();
  config.chunk_bytes = 1 << 20;
  const std::vector<Allreduce> ops = {{4 << 20}};  // 16 MB: 16 chunks of 1 MB
  const auto outcomes = run_ranks(4, [&](int r, const std::string& dir) {
    CudaIpcLaneConfig mine = config;
    // Killed with the others blocked waiting for its slice of chunk 5 (their reads of its workspace
    // done): on a GPU a rank dying under a peer's kernel may fault that peer's context instead.
    if (r == 2)
      mine.after_copy_in = [](uint64_t step) {
        if (step == 5) {
          ::usleep(200 * 1000);
          ::raise(SIGKILL);
        }
      };
    return lane_job(r, dir, 4, mine, ops);
  }, kJobTimeoutS);
  EXPECT_EQ(outcomes[2].signal, SIGKILL);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(outcomes[r].exit_code, 2) << "rank " << r << ": " << outcomes[r].report;
    EXPECT_NE(outcomes[r].report.find("PeerError(2)"), std::string::npos) << outcomes[r].report;
    EXPECT_NE(outcomes[r].report.find("rank 2"), std::string::npos) << outcomes[r].report;
  }
  EXPECT_EQ(dev_shm_entries(), before);
}

TEST(CudaIpcLane, StalledRankIsNamedWhenTheDeadlinePasses) {
  SKIP_WITHOUT_GPU();
  CudaIpcLaneConfig config = test_config();
  config.chunk_bytes = 64 << 10;
  config.small_bytes = 4 << 10;
  Allreduce op{100000};  // sliced: the others wait for rank 1's reduction
  op.timeout_s = 0.5;
  const auto outcomes = run_ranks(3, [&](int r, const std::string& dir) {
    CudaIpcLaneConfig mine = config;
    if (r == 1) mine.after_copy_in = [](uint64_t step) { if (step == 0) ::sleep(2); };
    return lane_job(r, dir, 3, mine, {op});
  }, kJobTimeoutS);
  // The first rank whose deadline passes times out naming rank 1 and blames it in its segment; a rank
  // woken by that failure names rank 1 as reported by the first.
  int timeouts = 0;
  for (int r : {0, 2}) {
    EXPECT_EQ(outcomes[r].exit_code, 2) << outcomes[r].report;
    const bool timed_out = outcomes[r].report.find("TimeoutError(1)") != std::string::npos &&
                           outcomes[r].report.find("timed out waiting for rank 1 to reduce its slice") != std::string::npos;
    const bool told = outcomes[r].report.find("PeerError(1)") != std::string::npos &&
                      outcomes[r].report.find("rank 1 is gone or stuck") != std::string::npos;
    EXPECT_TRUE(timed_out || told) << outcomes[r].report;
    timeouts += timed_out;
  }
  EXPECT_GE(timeouts, 1);
  EXPECT_EQ(outcomes[1].exit_code, 2) << "the stalled rank finds the others gone: " << outcomes[1].report;
}

TEST(CudaIpcLane, AbortWakesTheWaiterAndFailsThePeers) {
  SKIP_WITHOUT_GPU();
  const CudaIpcLaneConfig config = test_config();
  const auto outcomes = run_ranks(2, [&](int rank, const std::string& dir) {
    CudaRank cr = CudaRank::open();
    CudaIpcLane lane(config, rank, 2);
    const Deadline deadline = Deadline::after_seconds(30);
    lane.connect(testing::exchange_addresses(dir, rank, 2, lane.local_address(), deadline), deadline);
    const CudaDriver::DevicePtr buf = cr.alloc(4096);
    if (rank == 1) {  // joins late: rank 0 waits for it until aborted
      ::sleep(3);
      try {
        // The first may still complete (rank 0 placed its chunk before it aborted); the next cannot.
        lane.allreduce(buf, buf, 1024, DataType::kFloat32, ReduceOp::kSum, cr.stream, 0, deadline);
        lane.allreduce(buf, buf, 1024, DataType::kFloat32, ReduceOp::kSum, cr.stream, 1, deadline);
      } catch (const PeerError& e) {
        report(dir, rank, std::string("PeerError: ") + e.what());
        return 0;
      }
      return 1;
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      lane.abort("test abort");
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::string what = "no error";
    try {
      lane.allreduce(buf, buf, 1024, DataType::kFloat32, ReduceOp::kSum, cr.stream, 0, deadline);
    } catch (const NezhaError& e) {
      what = e.what();
    }
    aborter.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(dir, rank, what + (s < 2 ? "" : " (too late)"));
    ::sleep(2);  // alive (its workspace too) while rank 1 runs into the aborted lane
    return 0;
  }, kJobTimeoutS);
  EXPECT_EQ(outcomes[0].report, "CUDA IPC lane 'cudaipc', rank 0 aborted: test abort");
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].report;
  EXPECT_NE(outcomes[1].report.find("rank 0 left the lane"), std::string::npos) << outcomes[1].report;
}

TEST(CudaIpcLane, OneRankIsACopy) {
  SKIP_WITHOUT_GPU();
  const CudaIpcLaneConfig config = test_config();
  const std::vector<Allreduce> ops = {{3}, {100003, DataType::kFloat16, ReduceOp::kAverage}};
  const auto outcomes =
      run_ranks(1, [&](int r, const std::string& dir) { return lane_job(r, dir, 1, config, ops); }, kJobTimeoutS);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].report;
}

TEST(CudaIpcLane, RanksWithOtherSlotsAreRefusedAtConnect) {
  SKIP_WITHOUT_GPU();
  const CudaIpcLaneConfig common = test_config();  // the same secret on every rank
  const auto outcomes = run_ranks(2, [&](int r, const std::string& dir) {
    CudaIpcLaneConfig config = common;
    if (r == 1) config.small_bytes = 8 << 10;
    return lane_job(r, dir, 2, config, {{100}});
  }, kJobTimeoutS);
  for (const auto& o : outcomes) {
    EXPECT_EQ(o.exit_code, 2) << o.report;
    EXPECT_NE(o.report.find("ProtocolError"), std::string::npos) << o.report;
    EXPECT_NE(o.report.find("-byte slots"), std::string::npos) << o.report;
  }
}

TEST(CudaIpcLane, MismatchedOperationIsAProtocolErrorOnEveryRank) {
  SKIP_WITHOUT_GPU();
  const CudaIpcLaneConfig config = test_config();
  const auto outcomes = run_ranks(2, [&](int r, const std::string& dir) {
    return lane_job(r, dir, 2, config, {{r == 0 ? size_t{100} : size_t{101}}});
  }, kJobTimeoutS);
  for (const auto& o : outcomes) {
    EXPECT_EQ(o.exit_code, 2) << o.report;
    EXPECT_NE(o.report.find("ProtocolError"), std::string::npos) << o.report;
  }
}

}  // namespace
}  // namespace nezha::cuda
