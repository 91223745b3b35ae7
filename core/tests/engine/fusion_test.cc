// Fusion of broadcasts, allgathers and reducescatters (negotiation/fusion.h): which ready tensors
// the coordinator merges into one response, and the per-name layout that response carries. The
// fused operations' execution is checked in fused_collectives_test.cc.
#include "engine/negotiation/coordinator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/negotiation/fusion.h"

namespace nezha::engine {
namespace {

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

Request request(OpType type, const std::string& name, std::vector<int64_t> shape,
                DataType dtype = DataType::kFloat32) {
  Request r;
  r.type = type;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dtype;
  return r;
}

CoordinatorOptions options(int size, size_t unfused_bytes = 1 << 20) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_s = 0.005;
  o.unfused_bytes = unfused_bytes;
  return o;
}

std::vector<std::vector<std::string>> names_of(const std::vector<Response>& rs) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : rs) out.push_back(r.names);
  return out;
}

using Names = std::vector<std::vector<std::string>>;

TEST(FusionTest, AllgathersFuseWithEveryNamesRowsPerRank) {
  Coordinator c(options(3));
  // Rank r has r + 1 rows of "a" (rows of 2) and 3 - r rows of "b" (rows of 5).
  for (int r = 0; r < 3; ++r)
    c.submit(r, {request(OpType::kAllgather, "a", {r + 1, 2}), request(OpType::kAllgather, "b", {3 - r, 5})}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(names_of(out), (Names{{"a", "b"}}));
  EXPECT_EQ(out[0].type, OpType::kAllgather);
  EXPECT_EQ(out[0].row_elements, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(out[0].rank_rows, (std::vector<int64_t>{1, 2, 3, 3, 2, 1}));
  EXPECT_EQ(out[0].cache_ids.size(), 2u);
  EXPECT_EQ(gathered_elements(out[0]), 6u * 2 + 6u * 5);
  EXPECT_EQ(fusion_bytes(out[0]), (6u * 2 + 6u * 5) * 4);
}

TEST(FusionTest, ReducescattersFuseWithEveryNamesCountsAndBlocks) {
  Coordinator c(options(2));
  Request a = request(OpType::kReducescatter, "a", {5, 3});
  Request b = request(OpType::kReducescatter, "b", {2});
  c.submit(0, {a, b}, t0);
  c.submit(1, {a, b}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(names_of(out), (Names{{"a", "b"}}));
  EXPECT_EQ(out[0].counts, (std::vector<int64_t>{15, 2}));
  EXPECT_EQ(out[0].row_elements, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(out[0].rank_rows, (std::vector<int64_t>{3, 2, 1, 1}));
}

TEST(FusionTest, BroadcastsFuseOnlyFromTheSameRoot) {
  Coordinator c(options(2));
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(request(OpType::kBroadcast, "p" + std::to_string(i), {7}));
    reqs.back().root = i < 3 ? 1 : 0;
  }
  c.submit(0, reqs, t0);
  c.submit(1, reqs, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(names_of(out), (Names{{"p0", "p1", "p2"}, {"p3"}}));
  EXPECT_EQ(out[0].counts, (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(out[0].root, 1);
}

TEST(FusionTest, KindsDtypesOpsAndScalesKeepTensorsApart) {
  Coordinator c(options(2));
  Request max = request(OpType::kReducescatter, "r2", {4});
  max.op = ReduceOp::kMax;
  Request scaled = request(OpType::kReducescatter, "r3", {4});
  scaled.prescale = 2;
  const std::vector<Request> reqs = {
      request(OpType::kAllgather, "g1", {4}),     request(OpType::kAllgather, "g2", {4}, DataType::kFloat64),
      request(OpType::kReducescatter, "r1", {4}), max,
      scaled,                                     request(OpType::kAlltoall, "x1", {4}),
      request(OpType::kAlltoall, "x2", {4}),      request(OpType::kAllreduce, "s1", {4}),
      request(OpType::kAllgather, "g3", {4})};
  std::vector<Request> with_splits = reqs;
  for (auto& r : with_splits)
    if (r.type == OpType::kAlltoall) r.splits = {2, 2};
  // One at a time (first submission fixes the order, else tensors seen together go by name).
  for (size_t i = 0; i < with_splits.size(); ++i) c.submit(0, {with_splits[i]}, t0 + std::chrono::milliseconds(i));
  c.submit(1, with_splits, t0 + std::chrono::milliseconds(20));
  auto out = c.take_ready(t0 + std::chrono::milliseconds(20));
  EXPECT_EQ(names_of(out), (Names{{"g1"}, {"g2"}, {"r1"}, {"r2"}, {"r3"}, {"x1"}, {"x2"}, {"s1"}, {"g3"}}));
}

TEST(FusionTest, LargeTensorsRunAloneAndTheThresholdHolds) {
  CoordinatorOptions o = options(2, /*unfused_bytes=*/256);
  o.fusion_threshold = 200;
  Coordinator c(o);
  // Allgather bytes count what it returns: 2 ranks x rows x 4 bytes.
  const std::vector<Request> reqs = {
      request(OpType::kAllgather, "a", {8}),   // 64 B
      request(OpType::kAllgather, "b", {8}),   // 64 B: fused, 128
      request(OpType::kAllgather, "c", {32}),  // 256 B: alone
      request(OpType::kAllgather, "d", {10}),  // 80 B
      request(OpType::kAllgather, "e", {10}),  // 80 B: 160
      request(OpType::kAllgather, "f", {10})};  // 80 B: 240 > 200, a new one
  c.submit(0, reqs, t0);
  c.submit(1, reqs, t0);
  EXPECT_EQ(names_of(c.take_ready(t0)), (Names{{"a", "b"}, {"c"}, {"d", "e"}, {"f"}}));
}

TEST(FusionTest, UnfusedThresholdGrowsWithTheFastestRailsBulkStartUp) {
  // amortized_range_bytes = kRangeAmortization x bulk start-up x rate: 8 x 2 ms x 1 Gbit/s = 2 MB.
  multirail::RailEstimate slow{50, 1, 10, 2000}, fast{20, 10, 10, 200};
  EXPECT_EQ(scaled_unfused_bytes(1 << 20, {}), size_t{1} << 20);     // nothing known
  EXPECT_EQ(scaled_unfused_bytes(1 << 20, {slow}), size_t{2000000});  // 8 x 2e-3 s x 1.25e8 B/s
  EXPECT_EQ(scaled_unfused_bytes(0, {slow}), 0u);                     // fusion of any size stays
  // The fastest rail decides (8 x 0.2 ms x 10 Gbit/s = 2 MB as well, from the other rail here).
  fast.bulk_alpha_us = 100;
  EXPECT_EQ(scaled_unfused_bytes(1 << 20, {slow, fast}), size_t{1} << 20);
  fast.bulk_alpha_us = 400;
  EXPECT_EQ(scaled_unfused_bytes(1 << 20, {slow, fast}), size_t{4000000});
  EXPECT_EQ(scaled_unfused_bytes(1 << 20, {slow, multirail::RailEstimate{}}), size_t{2000000});

  // The coordinator fuses what the rails' start-up makes worth fusing: 256 B alone at first, fused
  // once rank 0's estimates say a lone operation pays 8 x 25 us x 0.1 Gbit/s = 2500 B of start-up.
  CoordinatorOptions o = options(2, /*unfused_bytes=*/256);
  Coordinator c(o);
  const std::vector<Request> reqs = {request(OpType::kAllreduce, "a", {64}), request(OpType::kAllreduce, "b", {64})};
  c.submit(0, reqs, t0);
  c.submit(1, reqs, t0);
  EXPECT_EQ(names_of(c.take_ready(t0)), (Names{{"a"}, {"b"}}));
  c.set_rail_estimates({multirail::RailEstimate{5, 0.1, 10, 25}});
  c.submit(0, reqs, t0);
  c.submit(1, reqs, t0);
  EXPECT_EQ(names_of(c.take_ready(t0)), (Names{{"a", "b"}}));
}

TEST(FusionTest, ProcessSetsFuseOnlyTheirOwnTensors) {
  ProcessSetTable sets(3);
  const int32_t set = sets.add({0, 2});
  CoordinatorOptions o = options(3);
  o.process_sets = &sets;
  Coordinator c(o);
  auto in_set = [&](Request r) {
    r.process_set = set;
    r.name = process_set_name(r.name, set);
    return r;
  };
  for (int r : {0, 2})
    c.submit(r, {in_set(request(OpType::kAllgather, "a", {r + 1})), in_set(request(OpType::kAllgather, "b", {2}))}, t0);
  for (int r = 0; r < 3; ++r) c.submit(r, {request(OpType::kAllgather, "c", {1})}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].names.size(), 2u);
  EXPECT_EQ(out[0].process_set, set);
  EXPECT_EQ(out[0].rank_rows, (std::vector<int64_t>{1, 3, 2, 2}));  // the members' rows only
  EXPECT_EQ(names_of({out[1]}), (Names{{"c"}}));
}

}  // namespace
}  // namespace nezha::engine
