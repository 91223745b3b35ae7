// Coordinator: the negotiation logic on rank 0. Pure (no sockets, no threads, time passed in), so
// every rule is checked here with an explicit clock.
#include "engine/negotiation/coordinator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "coordinator_requests.h"

namespace nezha::engine {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

using testing::allgather;
using testing::allreduce;
using testing::mismatch_error;
using testing::options;
using testing::submit_all;
using testing::t0;

Request broadcast(const std::string& name, int root) {
  Request r = allreduce(name);
  r.type = OpType::kBroadcast;
  r.root = root;
  return r;
}

Request join_request() {
  Request r;
  r.type = OpType::kJoin;
  r.name = kJoinTensorName;
  return r;
}

Request cached(const std::string& name, int32_t id) {
  Request r;
  r.name = name;
  r.cache_id = id;
  return r;
}

std::vector<std::vector<std::string>> names_of(const std::vector<Response>& rs) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : rs) out.push_back(r.names);
  return out;
}

TEST(CoordinatorTest, TensorIsReadyOnlyWhenEveryRankSubmitted) {
  Coordinator c(options(3));
  c.submit(0, {allreduce("x")}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  c.submit(2, {allreduce("x")}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  EXPECT_TRUE(c.has_pending());
  c.submit(1, {allreduce("x")}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(out[0].type, OpType::kAllreduce);
  EXPECT_EQ(out[0].names, std::vector<std::string>{"x"});
  EXPECT_EQ(out[0].counts, std::vector<int64_t>{4});
  EXPECT_EQ(out[0].dtype, DataType::kFloat32);
  EXPECT_FALSE(c.has_pending());
  EXPECT_TRUE(c.take_ready(t0).empty());
}

TEST(CoordinatorTest, SubmitsInDifferentOrdersGiveOneOrderOfFirstSubmission) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;  // one response per tensor, so the order is visible
  Coordinator c(o);
  c.submit(0, {allreduce("b")}, t0);
  c.submit(0, {allreduce("c")}, t0 + milliseconds(1));
  c.submit(0, {allreduce("a")}, t0 + milliseconds(2));
  c.submit(1, {allreduce("a"), allreduce("c"), allreduce("b")}, t0 + milliseconds(3));
  auto out = c.take_ready(t0 + milliseconds(3));
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"b"}, {"c"}, {"a"}}));
}

TEST(CoordinatorTest, ResponseOrderIsTheOrderTensorsBecameReady) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;
  Coordinator c(o);
  c.submit(0, {allreduce("a"), allreduce("b"), allreduce("c")}, t0);
  c.submit(1, {allreduce("c")}, t0 + milliseconds(1));
  c.submit(1, {allreduce("b")}, t0 + milliseconds(2));
  c.submit(1, {allreduce("a")}, t0 + milliseconds(3));
  auto out = c.take_ready(t0 + milliseconds(3));
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"c"}, {"b"}, {"a"}}));
}

TEST(CoordinatorTest, MismatchedShapeNamesTensorFieldAndRanks) {
  std::string e = mismatch_error({allreduce("grad", {5}), allreduce("grad", {6}), allreduce("grad", {5})});
  EXPECT_NE(e.find("'grad'"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  EXPECT_NE(e.find("[5] on ranks 0,2; [6] on rank 1"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchedDtypeNamesTensorFieldAndRanks) {
  std::string e = mismatch_error(
      {allreduce("w", {4}, DataType::kFloat32), allreduce("w", {4}, DataType::kFloat64)});
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("float32 on rank 0; float64 on rank 1"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchedOperationNamesTensorFieldAndRanks) {
  std::string e = mismatch_error({allreduce("t"), allreduce("t"), allgather("t", {4})});
  EXPECT_NE(e.find("'t'"), std::string::npos) << e;
  EXPECT_NE(e.find("operation"), std::string::npos) << e;
  EXPECT_NE(e.find("allreduce on ranks 0,1; allgather on rank 2"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchedReduceOpNamesTensorFieldAndRanks) {
  std::string e = mismatch_error({allreduce("t", {4}, DataType::kFloat32, ReduceOp::kSum),
                                  allreduce("t", {4}, DataType::kFloat32, ReduceOp::kMax)});
  EXPECT_NE(e.find("reduce op"), std::string::npos) << e;
  EXPECT_NE(e.find("Sum on rank 0; Max on rank 1"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchedRootNamesTensorFieldAndRanks) {
  std::string e = mismatch_error({broadcast("bc", 1), broadcast("bc", 1), broadcast("bc", 2)});
  EXPECT_NE(e.find("'bc'"), std::string::npos) << e;
  EXPECT_NE(e.find("root"), std::string::npos) << e;
  EXPECT_NE(e.find("1 on ranks 0,1; 2 on rank 2"), std::string::npos) << e;
}

TEST(CoordinatorTest, BroadcastRootOutOfRangeIsAnError) {
  std::string e = mismatch_error({broadcast("bc", 2), broadcast("bc", 2)});
  EXPECT_NE(e.find("'bc'"), std::string::npos) << e;
  EXPECT_NE(e.find("root rank 2 is out of range"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchedPrescaleNamesTensorFieldAndRanks) {
  Request a = allreduce("p"), b = allreduce("p");
  a.prescale = 0.5;
  b.prescale = 2;
  std::string e = mismatch_error({a, b});
  EXPECT_NE(e.find("'p'"), std::string::npos) << e;
  EXPECT_NE(e.find("prescale"), std::string::npos) << e;
  EXPECT_NE(e.find("0.5 on rank 0; 2 on rank 1"), std::string::npos) << e;
}

TEST(CoordinatorTest, MismatchFailsOnlyThatTensor) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;
  Coordinator c(o);
  c.submit(0, {allreduce("ok1"), allreduce("bad", {2}), allreduce("ok2")}, t0);
  c.submit(1, {allreduce("ok1"), allreduce("bad", {3}), allreduce("ok2")}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 3u);
  std::map<std::string, Response::Kind> kinds;
  for (const auto& r : out) kinds[r.names.at(0)] = r.kind;
  EXPECT_EQ(kinds["ok1"], Response::Kind::kExecute);
  EXPECT_EQ(kinds["bad"], Response::Kind::kError);
  EXPECT_EQ(kinds["ok2"], Response::Kind::kExecute);
}

TEST(CoordinatorTest, AllgatherAllowsDifferentFirstDimension) {
  Coordinator c(options(3));
  c.submit(0, {allgather("g", {2, 3})}, t0);
  c.submit(1, {allgather("g", {5, 3})}, t0);
  c.submit(2, {allgather("g", {0, 3})}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kExecute) << out[0].error;
  EXPECT_EQ(out[0].type, OpType::kAllgather);
  EXPECT_EQ(out[0].row_elements, std::vector<int64_t>{3});
  EXPECT_EQ(out[0].rank_rows, (std::vector<int64_t>{2, 5, 0}));
}

TEST(CoordinatorTest, AllgatherRejectsDifferentTrailingDimensions) {
  std::string e = mismatch_error({allgather("g", {2, 3}), allgather("g", {2, 4})});
  EXPECT_NE(e.find("'g'"), std::string::npos) << e;
  EXPECT_NE(e.find("beyond the first dimension"), std::string::npos) << e;
  EXPECT_NE(e.find("[3] on rank 0; [4] on rank 1"), std::string::npos) << e;
}

TEST(CoordinatorTest, AllreducesFuseUpToThresholdInclusive) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 64;  // four float32[4] tensors exactly
  Coordinator c(o);
  submit_all(c, 2, {allreduce("t0"), allreduce("t1"), allreduce("t2"), allreduce("t3"), allreduce("t4")}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"t0", "t1", "t2", "t3"}));
  EXPECT_EQ(out[0].counts, (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(out[0].cache_ids.size(), 4u);
  EXPECT_EQ(out[1].names, std::vector<std::string>{"t4"});
}

TEST(CoordinatorTest, FusionStopsOneByteBelowThreshold) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 63;
  Coordinator c(o);
  submit_all(c, 2, {allreduce("t0"), allreduce("t1"), allreduce("t2"), allreduce("t3")}, t0);
  auto out = c.take_ready(t0);
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"t0", "t1", "t2"}, {"t3"}}));
}

TEST(CoordinatorTest, TensorLargerThanThresholdGoesAlone) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 32;
  Coordinator c(o);
  submit_all(c, 2, {allreduce("a", {2}), allreduce("big", {100}), allreduce("c", {2})}, t0);
  auto out = c.take_ready(t0);
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"a"}, {"big"}, {"c"}}));
}

TEST(CoordinatorTest, TensorsOfAtLeastUnfusedBytesRunAloneAndSmallOnesStillFuse) {
  CoordinatorOptions o = options(2);
  o.unfused_bytes = 64;  // float32[16] and up run alone
  Coordinator c(o);
  submit_all(c, 2,
             {allreduce("t0", {4}), allreduce("t1", {4}), allreduce("t2", {16}), allreduce("t3", {15}),
              allreduce("t4", {4}), allreduce("t5", {4}), allreduce("t6", {100}), allreduce("t7", {4})},
             t0);
  auto out = c.take_ready(t0);
  // t3 + t4 + t5 = 92 bytes: a fused buffer may exceed unfused_bytes, only its tensors may not reach it.
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{
                               {"t0", "t1"}, {"t2"}, {"t3", "t4", "t5"}, {"t6"}, {"t7"}}));
  o.unfused_bytes = 0;  // off: fusion up to the threshold only
  Coordinator all(o);
  submit_all(all, 2, {allreduce("a", {4}), allreduce("big", {16}), allreduce("c", {4})}, t0);
  EXPECT_EQ(names_of(all.take_ready(t0)), (std::vector<std::vector<std::string>>{{"a", "big", "c"}}));
}

TEST(CoordinatorTest, DifferentDtypesOpsOrScalesNeverFuse) {
  Request pre = allreduce("e");
  pre.prescale = 2;
  Request post = allreduce("f");
  post.postscale = 0.5;
  Coordinator c(options(2));
  submit_all(c, 2,
             {allreduce("a", {4}, DataType::kFloat32), allreduce("b", {4}, DataType::kFloat64),
              allreduce("c", {4}, DataType::kFloat32), allreduce("d", {4}, DataType::kFloat32, ReduceOp::kMax),
              pre, post, allreduce("g")},
             t0);
  auto out = c.take_ready(t0);
  EXPECT_EQ(names_of(out),
            (std::vector<std::vector<std::string>>{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}, {"f"}, {"g"}}));
  for (const auto& r : out) EXPECT_EQ(r.counts.size(), r.names.size());
}

TEST(CoordinatorTest, OtherOperationsAndErrorsBreakFusion) {
  Coordinator c(options(2));
  // Rank 0 submits one at a time (first submission fixes the order); rank 1 all at once.
  const std::vector<Request> rank0 = {allreduce("a"), allgather("g", {1}), allreduce("b"),
                                      allreduce("bad", {1}), allreduce("c"), allreduce("d")};
  for (size_t i = 0; i < rank0.size(); ++i) c.submit(0, {rank0[i]}, t0 + milliseconds(i));
  c.submit(1, {allreduce("d"), allreduce("c"), allreduce("bad", {2}), allreduce("b"), allgather("g", {1}), allreduce("a")},
           t0 + milliseconds(10));
  auto out = c.take_ready(t0 + milliseconds(10));
  EXPECT_EQ(names_of(out),
            (std::vector<std::vector<std::string>>{{"a"}, {"g"}, {"b"}, {"bad"}, {"c", "d"}}));
}

TEST(CoordinatorTest, TensorsFirstSeenTogetherAreOrderedByName) {
  // One message from rank 0 carries several names with the same arrival time: the tie is broken
  // by name, so the order does not depend on hash or submission order.
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;
  Coordinator c(o);
  c.submit(0, {allreduce("z"), allreduce("m"), allreduce("a")}, t0);
  c.submit(1, {allreduce("m"), allreduce("a"), allreduce("z")}, t0);
  EXPECT_EQ(names_of(c.take_ready(t0)),
            (std::vector<std::vector<std::string>>{{"a"}, {"m"}, {"z"}}));
}

TEST(CoordinatorTest, LoneReadyTensorIsDispatchedAtOnce) {
  Coordinator c(options(2));
  submit_all(c, 2, {allreduce("x")}, t0);
  EXPECT_EQ(c.take_ready(t0).size(), 1u);
  EXPECT_FALSE(c.next_wakeup(t0).has_value());
}

TEST(CoordinatorTest, ReadyTensorIsHeldForCycleTimeWhileAnotherIsPartial) {
  Coordinator c(options(2));  // cycle 5 ms
  c.submit(0, {allreduce("a"), allreduce("b")}, t0);
  c.submit(1, {allreduce("a")}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  auto wake = c.next_wakeup(t0);
  ASSERT_TRUE(wake.has_value());
  EXPECT_EQ(*wake, t0 + milliseconds(5));
  EXPECT_TRUE(c.take_ready(t0 + milliseconds(4)).empty());
  auto out = c.take_ready(t0 + milliseconds(5));
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"a"}}));
  // b is still partial: the next wakeup is now its stall check, not a cycle.
  wake = c.next_wakeup(t0 + milliseconds(5));
  ASSERT_TRUE(wake.has_value());
  EXPECT_EQ(*wake, t0 + seconds(60));
}

TEST(CoordinatorTest, HeldTensorFusesWithOneCompletedWithinCycle) {
  Coordinator c(options(2));
  c.submit(0, {allreduce("a"), allreduce("b")}, t0);
  c.submit(1, {allreduce("a")}, t0);
  EXPECT_TRUE(c.take_ready(t0 + milliseconds(1)).empty());
  c.submit(1, {allreduce("b")}, t0 + milliseconds(2));
  auto out = c.take_ready(t0 + milliseconds(2));  // nothing partial left: no reason to wait
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"a", "b"}}));
}

TEST(CoordinatorTest, HoldEndsWhenReadyBytesReachFusionThreshold) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 32;
  Coordinator c(o);
  c.submit(0, {allreduce("a", {8}), allreduce("b")}, t0);
  c.submit(1, {allreduce("a", {8})}, t0);
  EXPECT_EQ(names_of(c.take_ready(t0)), (std::vector<std::vector<std::string>>{{"a"}}));
}

TEST(CoordinatorTest, GroupIsReleasedOnlyWhenEveryMemberIsComplete) {
  auto member = [](const std::string& name) {
    Request r = allreduce(name);
    r.group = "grp";
    r.group_size = 3;
    return r;
  };
  Coordinator c(options(2));
  submit_all(c, 2, {member("g1"), member("g2")}, t0);
  c.submit(0, {member("g3")}, t0);
  EXPECT_TRUE(c.take_ready(t0 + seconds(1)).empty());  // no cycle can release a partial group
  ASSERT_TRUE(c.next_wakeup(t0 + seconds(1)).has_value());
  EXPECT_EQ(*c.next_wakeup(t0 + seconds(1)), t0 + seconds(60));  // only the stall check is due
  c.submit(1, {member("g3")}, t0 + seconds(2));
  auto out = c.take_ready(t0 + seconds(2));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"g1", "g2", "g3"}));
  EXPECT_FALSE(c.has_pending());
}

TEST(CoordinatorTest, UngroupedTensorIsNotBlockedByIncompleteGroup) {
  Request m = allreduce("g1");
  m.group = "grp";
  m.group_size = 2;
  Coordinator c(options(2));
  submit_all(c, 2, {m, allreduce("free", {4}, DataType::kInt32)}, t0);
  // "free" may be held for at most one cycle, never until the group completes.
  auto out = c.take_ready(t0);
  auto later = c.take_ready(t0 + milliseconds(5));
  out.insert(out.end(), later.begin(), later.end());
  EXPECT_EQ(names_of(out), (std::vector<std::vector<std::string>>{{"free"}}));
  EXPECT_TRUE(c.has_pending());  // g1 still waits for its group
}

TEST(CoordinatorTest, JoinedRankCountsAsSubmittingAllreduce) {
  Coordinator c(options(3));
  c.submit(2, {join_request()}, t0);
  c.submit(0, {allreduce("x", {7})}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  c.submit(1, {allreduce("x", {7})}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kExecute) << out[0].error;
  EXPECT_EQ(out[0].names, std::vector<std::string>{"x"});
  EXPECT_EQ(out[0].counts, std::vector<int64_t>{7});
  // Not every rank sent metadata, so nothing can be cached for it.
  EXPECT_EQ(out[0].cache_ids, std::vector<int32_t>{-1});
}

TEST(CoordinatorTest, JoinCompletesTensorsAlreadyPending) {
  Coordinator c(options(2));
  c.submit(0, {allreduce("x")}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  c.submit(1, {join_request()}, t0 + milliseconds(1));
  EXPECT_EQ(names_of(c.take_ready(t0 + milliseconds(1))),
            (std::vector<std::vector<std::string>>{{"x"}}));
}

TEST(CoordinatorTest, NonAllreduceWithJoinedRankIsAnError) {
  Coordinator c(options(3));
  c.submit(1, {join_request()}, t0);
  c.submit(0, {allgather("g", {2})}, t0);
  c.submit(2, {allgather("g", {2})}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kError);
  EXPECT_NE(out[0].error.find("'g'"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("allgather"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("rank 1 joined"), std::string::npos) << out[0].error;
}

TEST(CoordinatorTest, JoinResponseWhenAllRanksJoinedNamesLastJoiner) {
  Coordinator c(options(3));
  c.submit(2, {join_request()}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  c.submit(0, {join_request()}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
  c.submit(1, {join_request()}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, OpType::kJoin);
  EXPECT_EQ(out[0].names, std::vector<std::string>{kJoinTensorName});
  EXPECT_EQ(out[0].last_joined_rank, 1);
  // Join state resets: the next allreduce needs every rank again.
  c.submit(0, {allreduce("after")}, t0);
  EXPECT_TRUE(c.take_ready(t0).empty());
}

TEST(CoordinatorTest, ResponseCacheSkipsMetadataOnLaterSteps) {
  Coordinator c(options(2));
  submit_all(c, 2, {allreduce("x", {3}, DataType::kInt64, ReduceOp::kMin)}, t0);
  auto first = c.take_ready(t0);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].cache_ids.size(), 1u);
  const int32_t id = first[0].cache_ids[0];
  ASSERT_GE(id, 0);

  submit_all(c, 2, {cached("x", id)}, t0 + seconds(1));
  auto second = c.take_ready(t0 + seconds(1));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(second[0].type, first[0].type);
  EXPECT_EQ(second[0].names, first[0].names);
  EXPECT_EQ(second[0].counts, first[0].counts);
  EXPECT_EQ(second[0].dtype, first[0].dtype);
  EXPECT_EQ(second[0].op, first[0].op);
  EXPECT_EQ(second[0].cache_ids, first[0].cache_ids);
}

TEST(CoordinatorTest, DistinctTensorsGetDistinctCacheIds) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;
  Coordinator c(o);
  submit_all(c, 2, {allreduce("a"), allreduce("b")}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_GE(out[0].cache_ids.at(0), 0);
  EXPECT_GE(out[1].cache_ids.at(0), 0);
  EXPECT_NE(out[0].cache_ids[0], out[1].cache_ids[0]);
}

TEST(CoordinatorTest, CacheCapacityIsRespected) {
  CoordinatorOptions o = options(2);
  o.fusion_threshold = 0;
  o.cache_capacity = 1;
  Coordinator c(o);
  submit_all(c, 2, {allreduce("a"), allreduce("b")}, t0);
  auto out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].cache_ids, std::vector<int32_t>{0});
  EXPECT_EQ(out[1].cache_ids, std::vector<int32_t>{-1});
}

TEST(CoordinatorTest, PartlyCachedSubmissionIsStillValidated) {
  Coordinator c(options(2));
  submit_all(c, 2, {allreduce("x", {4})}, t0);
  const int32_t id = c.take_ready(t0).at(0).cache_ids.at(0);
  c.submit(0, {cached("x", id)}, t0 + seconds(1));
  c.submit(1, {allreduce("x", {8})}, t0 + seconds(1));
  auto out = c.take_ready(t0 + seconds(1));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kError);
  EXPECT_NE(out[0].error.find("[4] on rank 0; [8] on rank 1"), std::string::npos) << out[0].error;
}

TEST(CoordinatorTest, UnknownCacheIdThrowsProtocolError) {
  Coordinator c(options(2));
  EXPECT_THROW(c.submit(0, {cached("x", 0)}, t0), ProtocolError);
  submit_all(c, 2, {allreduce("x")}, t0);
  const int32_t id = c.take_ready(t0).at(0).cache_ids.at(0);
  EXPECT_THROW(c.submit(1, {cached("x", id + 1)}, t0), ProtocolError);
  EXPECT_THROW(c.submit(1, {cached("other", id)}, t0), ProtocolError);  // id of another name
}

TEST(CoordinatorTest, SameNameTwiceInFlightIsProtocolError) {
  Coordinator c(options(2));
  c.submit(0, {allreduce("x")}, t0);
  EXPECT_THROW(c.submit(0, {allreduce("x")}, t0), ProtocolError);
}

class CoordinatorStallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = log_level();
    set_log_level(LogLevel::kWarning);
  }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::kWarning;
};

int count_of(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

TEST_F(CoordinatorStallTest, WarnsOnceAfterStallCheck) {
  CoordinatorOptions o = options(3);
  o.stall_check_s = 2;
  Coordinator c(o);
  c.submit(0, {allreduce("slow")}, t0);
  c.submit(2, {allreduce("slow")}, t0);
  ASSERT_TRUE(c.next_wakeup(t0).has_value());
  EXPECT_EQ(*c.next_wakeup(t0), t0 + seconds(2));

  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(c.check_stalls(t0 + milliseconds(1999)).empty());
  std::string before = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(before, "stall"), 0) << before;

  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(c.check_stalls(t0 + seconds(2)).empty());
  EXPECT_TRUE(c.check_stalls(t0 + seconds(3)).empty());
  EXPECT_TRUE(c.check_stalls(t0 + seconds(30)).empty());
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(log, "stall"), 1) << log;
  EXPECT_NE(log.find("'slow'"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 has not submitted"), std::string::npos) << log;
  // Warned: no more wakeups for it (no shutdown configured).
  EXPECT_FALSE(c.next_wakeup(t0 + seconds(30)).has_value());
  EXPECT_TRUE(c.has_pending());
}

TEST_F(CoordinatorStallTest, ErrorsAfterStallShutdownNamingMissingRanks) {
  CoordinatorOptions o = options(4);
  o.stall_check_s = 1;
  o.stall_shutdown_s = 5;
  Coordinator c(o);
  c.submit(0, {allreduce("stuck")}, t0);
  c.submit(2, {allreduce("stuck")}, t0);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(c.check_stalls(t0 + seconds(1)).empty());
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.next_wakeup(t0 + seconds(1)).has_value());
  EXPECT_EQ(*c.next_wakeup(t0 + seconds(1)), t0 + seconds(5));
  EXPECT_TRUE(c.check_stalls(t0 + milliseconds(4999)).empty());
  auto out = c.check_stalls(t0 + seconds(5));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kError);
  EXPECT_EQ(out[0].names, std::vector<std::string>{"stuck"});
  EXPECT_NE(out[0].error.find("'stuck'"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("ranks 1,3"), std::string::npos) << out[0].error;
  EXPECT_FALSE(c.has_pending());
  EXPECT_TRUE(c.check_stalls(t0 + seconds(10)).empty());
}

TEST_F(CoordinatorStallTest, CompleteTensorsNeverStall) {
  CoordinatorOptions o = options(2);
  o.stall_check_s = 1;
  o.stall_shutdown_s = 2;
  Coordinator c(o);
  submit_all(c, 2, {allreduce("x")}, t0);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(c.check_stalls(t0 + seconds(10)).empty());
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(log, "stall"), 0) << log;
  EXPECT_EQ(c.take_ready(t0 + seconds(10)).size(), 1u);
}

TEST_F(CoordinatorStallTest, StallOfTensorWaitingForItsGroupNamesTheGroup) {
  // Was a bug (core/src/engine/coordinator.cc, check_stalls / missing_ranks): a group member that every
  // rank submitted stays in pending_ until the rest of its group is complete. If a member is never
  // submitted (e.g. group_size too large on every rank), the stall warning and the stall-shutdown
  // error blame "ranks " followed by an empty list ("tensor 'g1' stalled for 5 s: ranks  never
  // submitted it"), which points the user at no rank and hides the real cause. Fix: in
  // check_stalls, when missing_ranks(p) is empty the tensor is complete and waiting for its group;
  // report "tensor 'g1' is complete but group 'grp' has k of n members ready" instead.
  Request m = allreduce("g1");
  m.group = "grp";
  m.group_size = 2;
  CoordinatorOptions o = options(2);
  o.stall_check_s = 1;
  o.stall_shutdown_s = 5;
  Coordinator c(o);
  submit_all(c, 2, {m}, t0);
  ::testing::internal::CaptureStderr();
  auto out = c.check_stalls(t0 + seconds(5));
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].error.find("grp"), std::string::npos) << out[0].error;
  EXPECT_EQ(out[0].error.find("ranks  "), std::string::npos) << out[0].error;
}

}  // namespace
}  // namespace nezha::engine
