// Balanced broadcast, allgather, reducescatter and alltoall end to end (striped_part_task.cc): ranks
// as threads, two in-memory rails paced alike and warmed up, then rail 1 slowed 16x after the plan
// was made. The slowed rail must end up carrying less than its planned half of each operation,
// every rank must get exactly the reference result, and with balancing off the same run keeps the
// planned split (so the first check can fail).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::make_request;
using testing::submit;

constexpr int kRanks = 4;
constexpr size_t kBlock = 2 << 20;  // float32 elements per rank's block: 8 MiB, 32 MiB per operation
constexpr int kRoot = 3;
// Pacing, us per KiB sent: both rails while the cost models learn (~100 MB/s per rank and rail),
// then rail 1. The pace is a sleep per send, and a loaded machine wakes every sleeper late by about
// the same time: 16x, not 8x, keeps the slowed rail clearly slower there too (at 8x one ASan CI run
// on a busy machine ended at the planned split).
constexpr double kPace = 10, kSlowedPace = 160;

float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 31) - 15); }

std::vector<float> output_of(const std::shared_ptr<OpHandle>& h) {
  std::vector<float> v(h->result().output.size() / sizeof(float));
  std::memcpy(v.data(), h->result().output.data(), v.size() * sizeof(float));
  return v;
}

// Runs one operation of `type` on every rank and checks every rank's result against a reference
// computed here (integer-valued floats: any summation order is exact).
void run_and_check(Cluster& c, OpType type, const std::string& name) {
  std::vector<std::vector<float>> in(kRanks);
  std::vector<std::shared_ptr<OpHandle>> h(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    Request q;
    switch (type) {
      case OpType::kBroadcast:
        in[r].assign(kRanks * kBlock, -1.0f);
        if (r == kRoot)
          for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = value(r, i);
        q = make_request(type, name, DataType::kFloat32, {static_cast<int64_t>(kRanks * kBlock)});
        q.root = kRoot;
        break;
      case OpType::kAllgather:
        in[r].resize(kBlock);
        for (size_t i = 0; i < kBlock; ++i) in[r][i] = value(r, i);
        q = make_request(type, name, DataType::kFloat32, {static_cast<int64_t>(kBlock)});
        break;
      default:  // reducescatter, alltoall: a block for every rank
        in[r].resize(kRanks * kBlock);
        for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = value(r, i);
        q = make_request(type, name, DataType::kFloat32, {static_cast<int64_t>(kRanks * kBlock)});
        if (type == OpType::kAlltoall) q.splits.assign(kRanks, static_cast<int64_t>(kBlock));
        break;
    }
    h[r] = submit(c[r], q, in[r].data(), type == OpType::kBroadcast ? in[r].data() : nullptr);
  }
  for (int r = 0; r < kRanks; ++r) testing::expect_ok(h[r], name + " rank " + std::to_string(r), 60);
  for (int r = 0; r < kRanks; ++r) {
    const std::string at = name + " rank " + std::to_string(r);
    std::vector<float> got = type == OpType::kBroadcast ? in[r] : output_of(h[r]);
    std::vector<float> want;
    for (size_t i = 0; i < (type == OpType::kReducescatter ? kBlock : kRanks * kBlock); ++i) {
      switch (type) {
        case OpType::kBroadcast: want.push_back(value(kRoot, i)); break;
        case OpType::kAllgather: want.push_back(value(static_cast<int>(i / kBlock), i % kBlock)); break;
        case OpType::kAlltoall:  // from rank i / kBlock, its block for r
          want.push_back(value(static_cast<int>(i / kBlock), r * kBlock + i % kBlock));
          break;
        default: {
          float sum = 0;
          for (int q = 0; q < kRanks; ++q) sum += value(q, r * kBlock + i);
          want.push_back(sum);
        }
      }
    }
    ASSERT_EQ(got.size(), want.size()) << at;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << at << " [" << i << "]";
  }
}

// Rail 1's fraction of the bytes each rank sent during one checked operation of `type`, run after
// both rails were warmed up alike and rail 1 was then slowed 16x.
std::vector<double> rail1_fraction_when_slowed(OpType type, size_t balance_bytes) {
  auto rails = testing::memory_rails(2);
  Cluster c(kRanks, rails, [=](EngineConfig& cfg) {
    cfg.timeout_s = 60;
    cfg.rail_stall_ms = 5000;  // a slowed rail is slow, not failed
    cfg.balance_bytes = balance_bytes;
    cfg.control_inline_bytes = 0;
  });
  auto w0 = testing::memory_world(rails, 0), w1 = testing::memory_world(rails, 1);
  w0->set_send_pace(kPace);
  w1->set_send_pace(kPace);
  for (int i = 0; i < 3; ++i) testing::allreduce_and_check(c, "warm-up", kBlock);  // the cost models learn
  w1->set_send_pace(kSlowedPace);
  const auto before0 = testing::bytes_sent(c, 0), before1 = testing::bytes_sent(c, 1);
  run_and_check(c, type, std::string(op_type_name(type)) + " slowed");
  const auto after0 = testing::bytes_sent(c, 0), after1 = testing::bytes_sent(c, 1);
  std::vector<double> out;
  for (int r = 0; r < kRanks; ++r) {
    const double d0 = static_cast<double>(after0[r] - before0[r]), d1 = static_cast<double>(after1[r] - before1[r]);
    out.push_back(d0 + d1 > 0 ? d1 / (d0 + d1) : 0);
  }
  return out;
}

class BalancedStripedTest : public ::testing::TestWithParam<OpType> {};

TEST_P(BalancedStripedTest, ARailSlowedAfterPlanningCarriesLessAndResultsStayExact) {
  const std::vector<double> frac = rail1_fraction_when_slowed(GetParam(), 256 << 10);
  // The senders' view: a broadcast's root and the ranks before the chain's end send; every rank
  // sends in the others. Balanced, the slowed rail keeps its first range (half its planned share)
  // and little more; planned, it keeps ~0.5 (WithBalancingOffTheSlowedRailKeepsItsPlannedShare).
  // Under ThreadSanitizer the instrumented copies and reductions, not the paced sends, set both
  // rails' speed, and the caller's rail can claim every range before the slowed rail's worker is
  // first scheduled (seen in CI: 0 % on every rank): there only exactness (checked above) is
  // asserted.
#ifndef __SANITIZE_THREAD__
  for (int r = 0; r < kRanks; ++r) {
    if (GetParam() == OpType::kBroadcast && frac[r] == 0) continue;  // the chain's last rank sends nothing
    EXPECT_LT(frac[r], 0.4) << "rank " << r << ": the slowed rail kept too much of its share";
    EXPECT_GT(frac[r], 0.05) << "rank " << r << ": the slowed rail carried nothing";
  }
#else
  (void)frac;
#endif
}

INSTANTIATE_TEST_SUITE_P(Ops, BalancedStripedTest,
                         ::testing::Values(OpType::kBroadcast, OpType::kAllgather, OpType::kReducescatter,
                                           OpType::kAlltoall),
                         [](const ::testing::TestParamInfo<OpType>& info) { return std::string(op_type_name(info.param)); });

// A balanced alltoall's ranges are kept large enough that each peer's piece is paced (alltoall.cc:
// unpaced pieces piled up in shaped links' queues and stalled 16 ranks for a retransmission
// timeout). Ranges shrink as shares drain and a slowed rail gives its rest away, so with 64 KiB
// ranges allowed this run would send 16 KiB pieces; none may fall between a claim (16 bytes) and
// kAlltoallPacedBytes.
TEST(BalancedStripedAlltoall, EveryPeersPieceStaysLargeEnoughToBePaced) {
  auto rails = testing::memory_rails(2);
  Cluster c(kRanks, rails, [](EngineConfig& cfg) {
    cfg.timeout_s = 60;
    cfg.rail_stall_ms = 5000;
    cfg.balance_bytes = 64 << 10;
    cfg.control_inline_bytes = 0;
  });
  auto w0 = testing::memory_world(rails, 0), w1 = testing::memory_world(rails, 1);
  w0->set_send_pace(kPace);
  w1->set_send_pace(kPace);
  for (int i = 0; i < 3; ++i) testing::allreduce_and_check(c, "warm-up", kBlock);
  w1->set_send_pace(kSlowedPace);
  auto unpaced = [&] {
    return w0->messages_sized(1024, collectives::kAlltoallPacedBytes) +
           w1->messages_sized(1024, collectives::kAlltoallPacedBytes);
  };
  const uint64_t before = unpaced();
  run_and_check(c, OpType::kAlltoall, "alltoall paced");
  EXPECT_EQ(unpaced() - before, 0u) << "pieces below the pacing threshold were sent";
}

TEST(BalancedStripedPlanned, WithBalancingOffTheSlowedRailKeepsItsPlannedShare) {
  const std::vector<double> frac = rail1_fraction_when_slowed(OpType::kAllgather, 0);
  // Under ThreadSanitizer the plan is learned from the instrumented copies of the warm-up, not the
  // paced sends (as above): it split 0.34 / 0.66 in one CI run. There only exactness is asserted.
#ifndef __SANITIZE_THREAD__
  for (int r = 0; r < kRanks; ++r)
    EXPECT_NEAR(frac[r], 0.5, 0.12) << "rank " << r << ": the plan (learned from the warm-up) decides alone";
#else
  (void)frac;
#endif
}

}  // namespace
}  // namespace nezha::engine
