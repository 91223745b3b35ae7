// Broadcast, allgather, reducescatter and alltoall striped over several rails (striped_part_task.cc):
// the parts of every block tile it exactly, results equal references computed here (uneven blocks,
// every rank bit-identical), both rails carry each operation, a process set's operations stripe
// too, and a rail lost while striped operations are in flight costs nothing but time; each with
// the plan's split and balanced (re-split range by range while the operations run).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/execution/striped_parts.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::make_request;
using testing::submit;
using testing::wait_all_up;

constexpr double kWaitS = 30;

TEST(BlockPart, PartsTileEveryBlockInOrder) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int shares = 1 + static_cast<int>(rng() % 4);
    std::vector<size_t> counts(shares);
    size_t total = 0;
    for (auto& c : counts) total += (c = rng() % 1000 + (trial % 3 == 0 ? 0 : 1));
    if (total == 0) continue;
    const size_t block = trial % 5 == 0 ? 0 : rng() % 100000;
    size_t offset = 0, next = 0;
    for (size_t c : counts) {
      BlockPart p = block_part(block, offset, c, total);
      ASSERT_EQ(p.begin, next) << "trial " << trial;
      next = p.begin + p.count;
      offset += c;
    }
    ASSERT_EQ(next, block) << "trial " << trial;
  }
  // Terabyte plans do not overflow.
  const size_t big = size_t{1} << 42;
  BlockPart p = block_part(big, big / 2, big / 2, big);
  EXPECT_EQ(p.begin, big / 2);
  EXPECT_EQ(p.count, big / 2);
}

Cluster two_rail_job(int size, size_t balance_bytes) {
  return Cluster(size, testing::loopback_rails(2), [=](EngineConfig& c) {
    c.balance_bytes = balance_bytes;
    c.control_inline_bytes = 0;
    c.rail_failover = true;
    c.rail_stall_ms = 1000;
    c.timeout_s = 15;
    c.rail_probe_backoff_s = 0.2;
  });
}

float value(int rank, int step, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step) % 29) - 14); }

struct Ops {
  std::vector<std::vector<float>> bc, ag_in, rs_in, a2a_in;
  std::vector<std::shared_ptr<OpHandle>> hb, hg, hr, ha;
};

constexpr size_t kRow = 3;

// Every rank starts one of each (large, uneven) operation, tagged `step`, in process set `set`
// (0: every rank) among `members`.
Ops start_all(Cluster& c, int step, const std::vector<int>& members, int32_t set = 0) {
  const int n = c.size(), m = static_cast<int>(members.size());
  Ops o;
  o.bc.resize(n);
  o.ag_in.resize(n);
  o.rs_in.resize(n);
  o.a2a_in.resize(n);
  o.hb.resize(n);
  o.hg.resize(n);
  o.hr.resize(n);
  o.ha.resize(n);
  const int root = members.back();
  for (int k = 0; k < m; ++k) {
    const int r = members[k];
    auto with_set = [&](Request q) { q.process_set = set; return q; };
    o.bc[r].resize(300001);
    for (size_t i = 0; i < o.bc[r].size(); ++i) o.bc[r][i] = r == root ? value(r, step, i) : -1;
    Request b = make_request(OpType::kBroadcast, "b" + std::to_string(step), DataType::kFloat32, {300001});
    b.root = root;
    o.hb[r] = submit(c[r], with_set(b), o.bc[r].data(), o.bc[r].data());  // in place
    const size_t rows = 40000 * static_cast<size_t>(k + 1) + 7;
    o.ag_in[r].resize(rows * kRow);
    for (size_t i = 0; i < o.ag_in[r].size(); ++i) o.ag_in[r][i] = value(r, step + 1, i);
    o.hg[r] = submit(c[r], with_set(make_request(OpType::kAllgather, "g" + std::to_string(step), DataType::kFloat32,
                                                 {static_cast<int64_t>(rows), kRow})),
                     o.ag_in[r].data(), nullptr);
    o.rs_in[r].resize(100001 * kRow);
    for (size_t i = 0; i < o.rs_in[r].size(); ++i) o.rs_in[r][i] = value(r, step + 2, i);
    o.hr[r] = submit(c[r], with_set(make_request(OpType::kReducescatter, "r" + std::to_string(step), DataType::kFloat32,
                                                 {100001, kRow}, ReduceOp::kSum)),
                     o.rs_in[r].data(), nullptr);
    Request a = make_request(OpType::kAlltoall, "a" + std::to_string(step), DataType::kFloat32, {0, kRow});
    int64_t total_rows = 0;
    for (int j = 0; j < m; ++j) {
      a.splits.push_back(20000 * (j + 1) + 11 * k);
      total_rows += a.splits.back();
    }
    a.shape[0] = total_rows;
    o.a2a_in[r].resize(static_cast<size_t>(total_rows) * kRow);
    for (size_t i = 0; i < o.a2a_in[r].size(); ++i) o.a2a_in[r][i] = value(r, step + 3, i);
    o.ha[r] = submit(c[r], with_set(a), o.a2a_in[r].data(), nullptr);
  }
  return o;
}

std::vector<float> output_of(const std::shared_ptr<OpHandle>& h) {
  std::vector<float> v(h->result().output.size() / sizeof(float));
  std::memcpy(v.data(), h->result().output.data(), v.size() * sizeof(float));
  return v;
}

void check_all(Ops& o, int step, const std::vector<int>& members) {
  const int m = static_cast<int>(members.size());
  const int root = members.back();
  for (int k = 0; k < m; ++k) {
    const int r = members[k];
    const std::string at = "step " + std::to_string(step) + " rank " + std::to_string(r);
    for (auto* h : {&o.hb[r], &o.hg[r], &o.hr[r], &o.ha[r]}) {
      ASSERT_TRUE((*h)->wait_for(kWaitS)) << at;
      ASSERT_EQ((*h)->error(), "") << at;
    }
    for (size_t i = 0; i < o.bc[r].size(); ++i) ASSERT_EQ(o.bc[r][i], value(root, step, i)) << at << " broadcast " << i;
    std::vector<float> want;
    for (int q : members) want.insert(want.end(), o.ag_in[q].begin(), o.ag_in[q].end());
    ASSERT_EQ(output_of(o.hg[r]), want) << at << " allgather";
    // Reducescatter: 100001 rows over m ranks, lower ranks one more.
    size_t first = 0;
    for (int j = 0; j < k; ++j) first += 100001 / m + (j < 100001 % m ? 1 : 0);
    const size_t mine = 100001 / m + (k < 100001 % m ? 1 : 0);
    std::vector<float> rs = output_of(o.hr[r]);
    ASSERT_EQ(rs.size(), mine * kRow) << at;
    for (size_t i = 0; i < rs.size(); ++i) {
      float sum = 0;
      for (int q : members) sum += o.rs_in[q][first * kRow + i];
      ASSERT_EQ(rs[i], sum) << at << " reducescatter " << i;
    }
    // Alltoall: from member j, its block for me (rows 20000 * (k + 1) + 11 * j).
    want.clear();
    for (int j = 0; j < m; ++j) {
      size_t off = 0;
      for (int t = 0; t < k; ++t) off += 20000 * (t + 1) + 11 * j;
      const size_t rows = 20000 * (k + 1) + 11 * j;
      const auto& src = o.a2a_in[members[j]];
      want.insert(want.end(), src.begin() + off * kRow, src.begin() + (off + rows) * kRow);
    }
    ASSERT_EQ(output_of(o.ha[r]), want) << at << " alltoall";
  }
}

uint64_t rail_bytes(Engine& e, int rail) { return e.rail_stats()[rail].bytes_sent; }

// The parameter: balance_bytes (0: the plan's split; 64 KiB: every operation here is balanced).
class StripedCollectives : public ::testing::TestWithParam<size_t> {};

TEST_P(StripedCollectives, EveryCollectiveOnBothRailsExact) {
  Cluster c = two_rail_job(3, GetParam());
  const std::vector<int> all = {0, 1, 2};
  for (int step = 0; step < 3; ++step) {
    Ops o = start_all(c, step, all);
    check_all(o, step, all);
  }
  // A large broadcast alone: both rails carry part of it.
  const uint64_t a0 = rail_bytes(c[2], 0), b0 = rail_bytes(c[2], 1);
  std::vector<std::vector<float>> buf(3, std::vector<float>(1 << 21, 1.0f));
  std::vector<std::shared_ptr<OpHandle>> h(3);
  for (int r = 0; r < 3; ++r) {
    Request b = make_request(OpType::kBroadcast, "alone", DataType::kFloat32, {1 << 21});
    b.root = 2;
    h[r] = submit(c[r], b, buf[r].data(), buf[r].data());
  }
  for (auto& x : h) testing::expect_ok(x, "broadcast alone", kWaitS);
  EXPECT_GT(rail_bytes(c[2], 0) - a0, (1u << 21) * 4u / 10) << "rail a carried too little of the broadcast";
  EXPECT_GT(rail_bytes(c[2], 1) - b0, (1u << 21) * 4u / 10) << "rail b carried too little of the broadcast";
}

TEST_P(StripedCollectives, AProcessSetsOperationsStripeToo) {
  Cluster c = two_rail_job(4, GetParam());
  const std::vector<int> members = {0, 2, 3};
  int32_t set = -1;
  for (int r = 0; r < 4; ++r) set = c[r].add_process_set(members);
  for (int step = 0; step < 2; ++step) {
    Ops o = start_all(c, step, members, set);
    check_all(o, step, members);
  }
  // Rank 1 skipped the set's operations on every rail they were striped over, so the whole job's
  // operations that follow pair up on each rail (same operation numbers on every rank).
  const std::vector<int> all = {0, 1, 2, 3};
  Ops o = start_all(c, 2, all);
  check_all(o, 2, all);
}

TEST_P(StripedCollectives, ARailLostUnderStripedOperationsIsRedoneExactly) {
  Cluster c = two_rail_job(3, GetParam());
  const std::vector<int> all = {0, 1, 2};
  for (int step = 0; step < 6; ++step) {
    if (step == 2) c[1].testing_fail_rail(1, "injected NIC error");
    if (step == 4) {
      ASSERT_TRUE(wait_all_up(c, 1)) << "rail b was not re-admitted";
      c[2].testing_fail_rail(0, "injected NIC error");
    }
    Ops o = start_all(c, step, all);
    check_all(o, step, all);
  }
}

INSTANTIATE_TEST_SUITE_P(Split, StripedCollectives, ::testing::Values(size_t{0}, size_t{64} << 10),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(info.param ? "Balanced" : "Planned");
                         });

}  // namespace
}  // namespace nezha::engine
