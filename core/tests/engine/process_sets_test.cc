// Process sets end to end (ranks as threads, loopback rails): collectives among a subset of the
// job's ranks, beside and interleaved with other sets' and global ones, against references computed
// here; errors for ranks outside a set and for mismatches inside one; a rail lost while a set's
// operations are in flight.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/negotiation/coordinator.h"
#include "engine/process_sets.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::expect_ok;
using testing::make_request;
using testing::submit;

constexpr double kWaitS = 20;

// --- the table ----------------------------------------------------------------------------------

TEST(ProcessSetTable, RegistersSortedSetsUnderIncreasingIds) {
  ProcessSetTable t(4);
  EXPECT_EQ(*t.members(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.add({3, 1}), 1);
  EXPECT_EQ(t.add({0}), 2);
  EXPECT_EQ(*t.members(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(t.ids(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(t.remove(1));
  EXPECT_FALSE(t.remove(1));
  EXPECT_EQ(t.members(1), nullptr);
  EXPECT_EQ(t.add({2, 3}), 3);  // ids are never reused
}

TEST(ProcessSetTable, RefusesBadSets) {
  ProcessSetTable t(3);
  EXPECT_THROW(t.add({}), InvalidArgument);
  EXPECT_THROW(t.add({0, 3}), InvalidArgument);
  EXPECT_THROW(t.add({-1}), InvalidArgument);
  EXPECT_THROW(t.add({1, 1}), InvalidArgument);
  EXPECT_THROW(t.remove(0), InvalidArgument);
}

TEST(ProcessSetTable, PairSetsAreKnownWithoutRegistrationAndNeverListedOrRemoved) {
  ProcessSetTable t(5);
  const int32_t p = t.pair_id(3, 1);
  EXPECT_EQ(p, t.pair_id(1, 3));
  EXPECT_GE(p, ProcessSetTable::kFirstPairId);
  EXPECT_EQ(*t.members(p), (std::vector<int>{1, 3}));
  EXPECT_NE(t.pair_id(0, 4), t.pair_id(1, 4));
  EXPECT_EQ(*t.members(t.pair_id(4, 0)), (std::vector<int>{0, 4}));
  EXPECT_EQ(t.members(ProcessSetTable::kFirstPairId + 2 * 5 + 1), nullptr);  // (2, 1): not a pair id
  EXPECT_EQ(t.ids(), (std::vector<int32_t>{0}));
  EXPECT_THROW(t.remove(p), InvalidArgument);
  EXPECT_THROW(t.pair_id(2, 2), InvalidArgument);
  EXPECT_THROW(t.pair_id(0, 5), InvalidArgument);
  EXPECT_EQ(t.add({0, 1}), 1);  // registered ids go on from 1
}

// --- the coordinator ----------------------------------------------------------------------------

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

Request set_allreduce(const std::string& name, int32_t set, std::vector<int64_t> shape = {4}) {
  Request r = make_request(OpType::kAllreduce, process_set_name(name, set), DataType::kFloat32,
                           std::move(shape));
  r.process_set = set;
  return r;
}

TEST(ProcessSetCoordinator, ReadyWhenEveryMemberSubmittedFusedOnlyWithinItsSet) {
  ProcessSetTable sets(4);
  const int32_t even = sets.add({0, 2}), odd = sets.add({1, 3});
  CoordinatorOptions opt;
  opt.size = 4;
  opt.process_sets = &sets;
  Coordinator c(opt);
  c.submit(0, {set_allreduce("a", even), set_allreduce("b", even)}, t0);
  c.submit(1, {set_allreduce("a", odd)}, t0);
  c.submit(3, {set_allreduce("a", odd)}, t0);
  c.submit(2, {set_allreduce("a", even), set_allreduce("b", even)}, t0);
  std::vector<Response> out = c.take_ready(t0 + std::chrono::seconds(1));
  ASSERT_EQ(out.size(), 2u);
  for (const Response& r : out) {
    EXPECT_EQ(r.kind, Response::Kind::kExecute) << r.error;
    EXPECT_EQ(r.cache_ids, std::vector<int32_t>(r.names.size(), -1));  // never cached
    EXPECT_TRUE(r.inline_result.empty());
  }
  // Odd's became ready first (ranks 1 and 3 had both submitted before rank 2 did).
  EXPECT_EQ(out[0].process_set, odd);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{process_set_name("a", odd)}));
  EXPECT_EQ(out[1].process_set, even);
  EXPECT_EQ(out[1].names.size(), 2u);  // even's two tensors fused, never with odd's
}

TEST(ProcessSetCoordinator, MismatchInsideASetNamesTheMembersAndOutsidersAreRefused) {
  ProcessSetTable sets(3);
  const int32_t s = sets.add({1, 2});
  CoordinatorOptions opt;
  opt.size = 3;
  opt.process_sets = &sets;
  Coordinator c(opt);
  c.submit(1, {set_allreduce("x", s, {4})}, t0);
  c.submit(2, {set_allreduce("x", s, {5})}, t0);
  c.submit(0, {set_allreduce("y", s)}, t0);  // rank 0 is not a member
  c.submit(1, {set_allreduce("z", 9)}, t0);  // no such set
  std::vector<Response> out = c.take_ready(t0 + std::chrono::seconds(1));
  ASSERT_EQ(out.size(), 3u);
  std::string all;
  for (const Response& r : out) {
    EXPECT_EQ(r.kind, Response::Kind::kError);
    all += r.error + "\n";
  }
  EXPECT_NE(all.find("mismatched shape across ranks: [4] on rank 1; [5] on rank 2"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 0 is not in process set " + std::to_string(s) + " (ranks 1, 2)"), std::string::npos)
      << all;
  EXPECT_NE(all.find("process set 9 is not registered"), std::string::npos) << all;
}

// --- end to end ---------------------------------------------------------------------------------

// Every rank of `c` registers the same sets in the same order (as add_process_set on every rank).
std::vector<int32_t> register_sets(Cluster& c, const std::vector<std::vector<int>>& sets) {
  std::vector<int32_t> ids;
  for (const auto& s : sets) {
    int32_t id = -1;
    for (int r = 0; r < c.size(); ++r) {
      int32_t got = c[r].add_process_set(s);
      if (r == 0) id = got;
      EXPECT_EQ(got, id) << "rank " << r;
    }
    ids.push_back(id);
  }
  return ids;
}

float value(int rank, int tag, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 7 + tag * 3) % 19) - 9); }

struct SetOp {
  std::vector<std::vector<float>> in, out;
  std::vector<std::shared_ptr<OpHandle>> h;
};

// Allreduce (`op`) of `count` floats among `members` (job ranks), tagged `tag` for its inputs.
SetOp start_allreduce(Cluster& c, int32_t set, const std::vector<int>& members, const std::string& name,
                      size_t count, int tag, ReduceOp op = ReduceOp::kSum) {
  SetOp s;
  s.in.assign(c.size(), std::vector<float>(count));
  s.out.assign(c.size(), std::vector<float>(count, -1000));
  s.h.resize(c.size());
  for (int r : members) {
    for (size_t i = 0; i < count; ++i) s.in[r][i] = value(r, tag, i);
    Request req = make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(count)}, op);
    req.process_set = set;
    s.h[r] = submit(c[r], req, s.in[r].data(), s.out[r].data());
  }
  return s;
}

void check_allreduce(SetOp& s, const std::vector<int>& members, const std::string& what, ReduceOp op = ReduceOp::kSum) {
  for (int r : members) expect_ok(s.h[r], what, kWaitS);
  const size_t count = s.in[members[0]].size();
  for (int r : members)
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q : members) want += s.in[q][i];
      // Horovod's Average: the sum times 1/size, the factor cast to the dtype.
      if (op == ReduceOp::kAverage) want *= static_cast<float>(1.0 / static_cast<double>(members.size()));
      ASSERT_EQ(s.out[r][i], want) << what << " rank " << r << " [" << i << "]";
    }
}

class ProcessSetEngine : public ::testing::TestWithParam<int> {};  // rails

TEST_P(ProcessSetEngine, SetsRunBesideEachOtherAndBesideGlobalOperations) {
  Cluster c(4, testing::loopback_rails(GetParam()), [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; });
  const std::vector<std::vector<int>> groups = {{0, 2}, {1, 3}, {0, 1, 3}};
  const auto ids = register_sets(c, groups);
  for (int step = 0; step < 3; ++step) {
    // Three sets' allreduces in flight at once (two of them overlap on ranks 0, 1, 3), and a
    // global one; sizes on both sides of striping.
    const size_t count = step == 1 ? (1 << 19) : 1000 + step;
    std::vector<SetOp> ops;
    for (size_t k = 0; k < ids.size(); ++k)
      ops.push_back(start_allreduce(c, ids[k], groups[k], "g" + std::to_string(step), count, step * 10 + int(k),
                                    k == 2 ? ReduceOp::kAverage : ReduceOp::kSum));
    SetOp global = start_allreduce(c, 0, {0, 1, 2, 3}, "g" + std::to_string(step), count, step * 10 + 9);
    for (size_t k = 0; k < ids.size(); ++k)
      check_allreduce(ops[k], groups[k], "set " + std::to_string(ids[k]) + " step " + std::to_string(step),
                      k == 2 ? ReduceOp::kAverage : ReduceOp::kSum);
    check_allreduce(global, {0, 1, 2, 3}, "global step " + std::to_string(step));
  }
}

TEST_P(ProcessSetEngine, BroadcastAllgatherAlltoallReducescatterInASet) {
  Cluster c(4, testing::loopback_rails(GetParam()), [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; });
  const std::vector<int> members = {1, 2, 3};
  const int32_t set = register_sets(c, {members})[0];
  const size_t n = members.size();
  auto with_set = [&](Request r) { r.process_set = set; return r; };

  // Broadcast from job rank 3 (the set's last member).
  std::vector<std::vector<float>> bin(4, std::vector<float>(777)), bout(4, std::vector<float>(777, -1));
  std::vector<std::shared_ptr<OpHandle>> h(4);
  for (int r : members) {
    for (size_t i = 0; i < 777; ++i) bin[r][i] = value(r, 1, i);
    Request req = make_request(OpType::kBroadcast, "b", DataType::kFloat32, {777});
    req.root = 3;
    h[r] = submit(c[r], with_set(req), bin[r].data(), bout[r].data());
  }
  for (int r : members) {
    expect_ok(h[r], "broadcast", kWaitS);
    EXPECT_EQ(bout[r], bin[3]) << "rank " << r;
  }
  // Allgather: member i contributes i + 1 rows of 3.
  std::vector<std::vector<int32_t>> gin(4);
  for (size_t k = 0; k < n; ++k) {
    const int r = members[k];
    gin[r].resize((k + 1) * 3);
    for (size_t i = 0; i < gin[r].size(); ++i) gin[r][i] = r * 100 + static_cast<int32_t>(i);
    h[r] = submit(c[r], with_set(make_request(OpType::kAllgather, "g", DataType::kInt32,
                                              {static_cast<int64_t>(k + 1), 3})),
                  gin[r].data(), nullptr);
  }
  std::vector<int32_t> gathered;
  for (int r : members) gathered.insert(gathered.end(), gin[r].begin(), gin[r].end());
  for (int r : members) {
    expect_ok(h[r], "allgather", kWaitS);
    std::vector<int32_t> got(gathered.size());
    ASSERT_EQ(h[r]->result().output.size(), got.size() * 4);
    std::memcpy(got.data(), h[r]->result().output.data(), got.size() * 4);
    EXPECT_EQ(got, gathered) << "rank " << r;
    EXPECT_EQ(h[r]->result().output_shape, (std::vector<int64_t>{6, 3}));
  }
  // Alltoall: member k sends j + 1 rows (of 2) to member j.
  std::vector<std::vector<double>> ain(4);
  for (size_t k = 0; k < n; ++k) {
    const int r = members[k];
    Request req = make_request(OpType::kAlltoall, "a", DataType::kFloat64, {6, 2});
    req.splits = {1, 2, 3};
    for (size_t i = 0; i < 12; ++i) ain[r].push_back(r * 1000.0 + static_cast<double>(i));
    h[r] = submit(c[r], with_set(req), ain[r].data(), nullptr);
  }
  for (size_t j = 0; j < n; ++j) {
    const int r = members[j];
    expect_ok(h[r], "alltoall", kWaitS);
    std::vector<double> want;
    for (size_t k = 0; k < n; ++k) {  // rows [sum(splits[:j]), +j+1) of member k
      size_t first = j * (j + 1) / 2;
      for (size_t row = first; row < first + j + 1; ++row)
        for (size_t col = 0; col < 2; ++col) want.push_back(ain[members[k]][row * 2 + col]);
    }
    std::vector<double> got(want.size());
    ASSERT_EQ(h[r]->result().output.size(), got.size() * 8) << "rank " << r;
    std::memcpy(got.data(), h[r]->result().output.data(), got.size() * 8);
    EXPECT_EQ(got, want) << "rank " << r;
  }
  // Reducescatter (Average over the set's 3 ranks) of 7 rows of 2: rows 3, 2, 2.
  std::vector<std::vector<float>> rin(4, std::vector<float>(14));
  for (int r : members) {
    for (size_t i = 0; i < 14; ++i) rin[r][i] = static_cast<float>(3 * (r + static_cast<int>(i)));
    h[r] = submit(c[r], with_set(make_request(OpType::kReducescatter, "rs", DataType::kFloat32, {7, 2},
                                              ReduceOp::kAverage)),
                  rin[r].data(), nullptr);
  }
  size_t row0 = 0;
  for (size_t k = 0; k < n; ++k) {
    const int r = members[k];
    const size_t rows = k == 0 ? 3 : 2;
    expect_ok(h[r], "reducescatter", kWaitS);
    std::vector<float> got(rows * 2);
    ASSERT_EQ(h[r]->result().output.size(), got.size() * 4) << "rank " << r;
    std::memcpy(got.data(), h[r]->result().output.data(), got.size() * 4);
    for (size_t i = 0; i < got.size(); ++i) {
      float sum = 0;
      for (int q : members) sum += rin[q][row0 * 2 + i];
      EXPECT_EQ(got[i], sum * static_cast<float>(1.0 / 3)) << "rank " << r << " [" << i << "]";
    }
    row0 += rows;
  }
}

INSTANTIATE_TEST_SUITE_P(Rails, ProcessSetEngine, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "rails"; });

// Point-to-point transfers as broadcasts in pair sets (what torch.distributed's send/recv become):
// a ring of transfers, each between two ranks only, in flight at once beside a global allreduce;
// large enough to be striped over two rails.
TEST_P(ProcessSetEngine, PairSetsCarryARingOfTransfersWithoutTheOtherRanks) {
  Cluster c(4, testing::loopback_rails(GetParam()), [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; });
  for (size_t count : {size_t{33}, size_t{1} << 19}) {
    std::vector<std::vector<float>> sent(4, std::vector<float>(count)), got(4, std::vector<float>(count, -1)),
        echo(4, std::vector<float>(count, -1));
    std::vector<std::shared_ptr<OpHandle>> sends(4), recvs(4);
    for (int r = 0; r < 4; ++r) {
      for (size_t i = 0; i < count; ++i) sent[r][i] = value(r, 7, i);
      const int next = (r + 1) % 4, prev = (r + 3) % 4;
      Request s = make_request(OpType::kBroadcast, "p2p." + std::to_string(r) + "." + std::to_string(next),
                               DataType::kFloat32, {static_cast<int64_t>(count)});
      s.root = r;
      s.process_set = c[r].pair_process_set(r, next);
      Request v = make_request(OpType::kBroadcast, "p2p." + std::to_string(prev) + "." + std::to_string(r),
                               DataType::kFloat32, {static_cast<int64_t>(count)});
      v.root = prev;
      v.process_set = c[r].pair_process_set(prev, r);
      // Odd ranks post their receive first: the order of a rank's submissions does not matter.
      if (r % 2) recvs[r] = submit(c[r], v, got[r].data(), got[r].data());
      sends[r] = submit(c[r], s, sent[r].data(), echo[r].data());
      if (r % 2 == 0) recvs[r] = submit(c[r], v, got[r].data(), got[r].data());
    }
    SetOp global = start_allreduce(c, 0, {0, 1, 2, 3}, "beside" + std::to_string(count), 1000, 5);
    for (int r = 0; r < 4; ++r) {
      expect_ok(sends[r], "send", kWaitS);
      expect_ok(recvs[r], "recv", kWaitS);
      EXPECT_EQ(got[r], sent[(r + 3) % 4]) << "rank " << r << " count " << count;
      EXPECT_EQ(echo[r], sent[r]) << "rank " << r;  // the root's own output is its input
    }
    check_allreduce(global, {0, 1, 2, 3}, "global beside the ring");
  }
}

TEST(ProcessSetEngineErrors, OutsidersAndUnknownSetsAreRefusedAtSubmission) {
  Cluster c(3);
  const int32_t set = register_sets(c, {{0, 1}})[0];
  float x[4] = {1, 2, 3, 4}, y[4];
  Request req = make_request(OpType::kAllreduce, "t", DataType::kFloat32, {4});
  req.process_set = set;
  try {
    submit(c[2], req, x, y);
    FAIL() << "rank 2 submitted to a set it is not in";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 is not in process set " + std::to_string(set) + " (ranks 0, 1)"),
              std::string::npos) << e.what();
  }
  req.process_set = 42;
  EXPECT_THROW(submit(c[0], req, x, y), InvalidArgument);
}

TEST(ProcessSetEngineErrors, AShapeMismatchFailsOnEveryMemberAndTheJobGoesOn) {
  Cluster c(3);
  const int32_t set = register_sets(c, {{0, 2}})[0];
  std::vector<float> a(5, 1), b(6, 1), out(6);
  Request r0 = make_request(OpType::kAllreduce, "m", DataType::kFloat32, {5});
  Request r2 = make_request(OpType::kAllreduce, "m", DataType::kFloat32, {6});
  r0.process_set = r2.process_set = set;
  auto h0 = submit(c[0], r0, a.data(), out.data());
  auto h2 = submit(c[2], r2, b.data(), out.data());
  for (auto* h : {&h0, &h2}) {
    ASSERT_TRUE((*h)->wait_for(kWaitS));
    EXPECT_NE((*h)->error().find("mismatched shape"), std::string::npos) << (*h)->error();
  }
  // The set and the job still work; the set can be removed once nothing of it is in flight.
  SetOp s = start_allreduce(c, set, {0, 2}, "after", 100, 3);
  check_allreduce(s, {0, 2}, "after the mismatch");
  SetOp g = start_allreduce(c, 0, {0, 1, 2}, "global", 100, 4);
  check_allreduce(g, {0, 1, 2}, "global after the mismatch");
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(c[r].remove_process_set(set));
}

TEST(ProcessSetEngineFailover, ARailLostUnderASetsOperationsIsRedoneExactly) {
  Cluster c(4, testing::loopback_rails(2), [](EngineConfig& cfg) {
    cfg.control_inline_bytes = 0;
    cfg.rail_failover = true;
    cfg.rail_stall_ms = 1000;
    cfg.timeout_s = 10;
    cfg.rail_probe_backoff_s = 0.2;
  });
  const std::vector<std::vector<int>> groups = {{0, 1}, {2, 3}};
  const auto ids = register_sets(c, groups);
  for (int step = 0; step < 6; ++step) {
    if (step == 2) c[1].testing_fail_rail(1, "injected NIC error");
    std::vector<SetOp> ops;
    for (size_t k = 0; k < ids.size(); ++k)
      ops.push_back(start_allreduce(c, ids[k], groups[k], "f" + std::to_string(step), 1 << 18, step * 2 + int(k)));
    SetOp global = start_allreduce(c, 0, {0, 1, 2, 3}, "f" + std::to_string(step), 1 << 18, 50 + step);
    for (size_t k = 0; k < ids.size(); ++k) check_allreduce(ops[k], groups[k], "set step " + std::to_string(step));
    check_allreduce(global, {0, 1, 2, 3}, "global step " + std::to_string(step));
  }
}

}  // namespace
}  // namespace nezha::engine
