// Small collectives done by rank 0 inside negotiation (engine/negotiation/control_inline.h): the results
// against plain loops, the size limit, and how the coordinator attaches results (never fused, kept
// through the response cache, never on errors). End to end, engine_threads_test.cc runs every
// allreduce, broadcast and allgather test both this way and on the rail.
#include "engine/negotiation/control_inline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {
namespace {

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> values_of(const std::string& s) {
  std::vector<T> v(s.size() / sizeof(T));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(T));
  return v;
}

template <typename T>
Request allreduce_with(const std::string& name, const std::vector<T>& input, DataType dtype,
                       ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = name;
  r.dtype = dtype;
  r.shape = {static_cast<int64_t>(input.size())};
  r.op = op;
  r.inline_input = bytes_of(input);
  return r;
}

Response response_for(const Request& r) {
  Response resp;
  resp.type = OpType::kAllreduce;
  resp.names = {r.name};
  resp.counts = {r.num_elements()};
  resp.dtype = r.dtype;
  resp.op = r.op;
  resp.prescale = r.prescale;
  resp.postscale = r.postscale;
  return resp;
}

template <typename T>
std::vector<T> reduce(const std::vector<std::vector<T>>& inputs, DataType dtype, ReduceOp op,
                      double prescale = 1, double postscale = 1) {
  std::vector<std::optional<Request>> by_rank;
  for (const auto& in : inputs) {
    by_rank.push_back(allreduce_with("t", in, dtype, op));
    by_rank.back()->prescale = prescale;
    by_rank.back()->postscale = postscale;
  }
  std::string out = inline_result_of(response_for(*by_rank[0]), by_rank);
  EXPECT_EQ(out.size(), inputs[0].size() * sizeof(T));
  return values_of<T>(out);
}

TEST(ControlInline, ScaledSumAndAverageMatchAPlainLoop) {
  const std::vector<std::vector<double>> in = {{1.5, -2, 7}, {0.25, 4, -1}, {3, 3, 3}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    std::vector<double> out = reduce(in, DataType::kFloat64, op, 0.5, 3);
    for (size_t i = 0; i < 3; ++i) {
      double sum = 0;
      for (const auto& r : in) sum += 0.5 * r[i];
      EXPECT_DOUBLE_EQ(out[i], op == ReduceOp::kSum ? 3 * sum : 3 * sum / 3) << reduce_op_name(op) << " " << i;
    }
  }
}

TEST(ControlInline, IntegerAverageRoundsTowardZeroAsOnTheRails) {
  std::vector<int32_t> out = reduce<int32_t>({{1, -1, 7}, {2, -2, 0}, {2, -2, 0}}, DataType::kInt32, ReduceOp::kAverage);
  EXPECT_EQ(out, (std::vector<int32_t>{1, -1, 2}));  // 5/3, -5/3, 7/3
}

TEST(ControlInline, MinMaxProductAndBool) {
  const std::vector<std::vector<int64_t>> in = {{5, -3, 2}, {-7, 4, 3}, {1, 1, -1}};
  EXPECT_EQ(reduce(in, DataType::kInt64, ReduceOp::kMin), (std::vector<int64_t>{-7, -3, -1}));
  EXPECT_EQ(reduce(in, DataType::kInt64, ReduceOp::kMax), (std::vector<int64_t>{5, 4, 3}));
  EXPECT_EQ(reduce(in, DataType::kInt64, ReduceOp::kProduct), (std::vector<int64_t>{-35, -12, -6}));
  const std::vector<std::vector<uint8_t>> flags = {{0, 1, 0}, {0, 1, 1}};
  EXPECT_EQ(reduce(flags, DataType::kBool, ReduceOp::kSum), (std::vector<uint8_t>{0, 1, 1}));  // or
  EXPECT_EQ(reduce(flags, DataType::kBool, ReduceOp::kMin), (std::vector<uint8_t>{0, 1, 0}));  // and
}

TEST(ControlInline, JoinedRankContributesZeros) {
  std::vector<std::optional<Request>> by_rank = {allreduce_with<float>("t", {-4, 2}, DataType::kFloat32, ReduceOp::kMax),
                                                 std::nullopt,
                                                 allreduce_with<float>("t", {-1, 1}, DataType::kFloat32, ReduceOp::kMax)};
  std::string out = inline_result_of(response_for(*by_rank[0]), by_rank);
  EXPECT_EQ(values_of<float>(out), (std::vector<float>{0, 2}));  // the zeros of rank 1 win -1
}

TEST(ControlInline, AMissingOrMisSizedInputMeansTheRails) {
  std::vector<std::optional<Request>> by_rank = {allreduce_with<float>("t", {1, 2}, DataType::kFloat32),
                                                 allreduce_with<float>("t", {3, 4}, DataType::kFloat32)};
  Response resp = response_for(*by_rank[0]);
  by_rank[1]->inline_input.clear();
  EXPECT_EQ(inline_result_of(resp, by_rank), "");
  by_rank[1]->inline_input = "abc";
  EXPECT_EQ(inline_result_of(resp, by_rank), "");
  resp.kind = Response::Kind::kError;
  by_rank[1] = by_rank[0];
  EXPECT_EQ(inline_result_of(resp, by_rank), "");
}

TEST(ControlInline, LimitIsWhatRankZeroReceivesFromAllOthers) {
  Request r;
  r.type = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = {1365};  // 5460 bytes x 3 other ranks <= 16384
  EXPECT_TRUE(wants_inline_input(r, 16384, 1, 4));
  r.shape = {1366};
  EXPECT_FALSE(wants_inline_input(r, 16384, 1, 4));
  // An allgather's result (4 inputs) goes to 3 ranks: 341 floats x 4 x 3 <= 16384.
  r.type = OpType::kAllgather;
  r.shape = {341};
  EXPECT_TRUE(wants_inline_input(r, 16384, 1, 4));
  r.shape = {342};
  EXPECT_FALSE(wants_inline_input(r, 16384, 1, 4));
  r.type = OpType::kAllreduce;
  r.shape = {1366};
  EXPECT_TRUE(wants_inline_input(r, 16384, 1, 2));
  EXPECT_FALSE(wants_inline_input(r, 0, 1, 2));
  EXPECT_FALSE(wants_inline_input(r, 16384, 0, 1));
  r.shape = {0};
  EXPECT_FALSE(wants_inline_input(r, 16384, 1, 2));
  // A broadcast's input travels from its root only; other collectives never.
  r.shape = {4};
  r.type = OpType::kBroadcast;
  r.root = 1;
  EXPECT_TRUE(wants_inline_input(r, 16384, 1, 2));
  EXPECT_FALSE(wants_inline_input(r, 16384, 0, 2));
  for (OpType t : {OpType::kAlltoall, OpType::kReducescatter, OpType::kBarrier, OpType::kJoin}) {
    r.type = t;
    EXPECT_FALSE(wants_inline_input(r, 16384, 1, 2)) << op_type_name(t);
  }
}

TEST(ControlInline, BroadcastCarriesTheRootsInputOnly) {
  std::vector<std::optional<Request>> by_rank(3);
  for (int rank = 0; rank < 3; ++rank) {
    by_rank[rank] = allreduce_with<int64_t>("b", {7, -8}, DataType::kInt64);
    by_rank[rank]->type = OpType::kBroadcast;
    by_rank[rank]->root = 2;
    if (rank != 2) by_rank[rank]->inline_input.clear();
  }
  by_rank[2]->inline_input = bytes_of(std::vector<int64_t>{5, 6});
  Response resp = response_for(*by_rank[0]);
  resp.type = OpType::kBroadcast;
  resp.root = 2;
  EXPECT_EQ(values_of<int64_t>(inline_result_of(resp, by_rank)), (std::vector<int64_t>{5, 6}));
  by_rank[2]->inline_input.clear();  // the root sent none (over its limit): the rails
  EXPECT_EQ(inline_result_of(resp, by_rank), "");
}

TEST(ControlInline, AllgatherConcatenatesInRankOrderWithEachRanksRows) {
  // Rows of 2 elements; rank r has r + 1 rows.
  std::vector<std::optional<Request>> by_rank;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<float> rows(2 * (rank + 1), static_cast<float>(rank));
    by_rank.push_back(allreduce_with<float>("g", rows, DataType::kFloat32));
    by_rank.back()->type = OpType::kAllgather;
    by_rank.back()->shape = {rank + 1, 2};
  }
  Response resp;
  resp.type = OpType::kAllgather;
  resp.names = {"g"};
  resp.dtype = DataType::kFloat32;
  resp.row_elements = {2};
  resp.rank_rows = {1, 2, 3};
  EXPECT_EQ(values_of<float>(inline_result_of(resp, by_rank)),
            (std::vector<float>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
  by_rank[1]->inline_input.pop_back();  // one rank's input of the wrong size: the rails
  EXPECT_EQ(inline_result_of(resp, by_rank), "");
}

TEST(ControlInline, DeliveryFillsOutputsAndRefusesAResultOfTheWrongSize) {
  // Allgather: the engine-allocated output with the gathered shape.
  Response g;
  g.type = OpType::kAllgather;
  g.names = {"g"};
  g.dtype = DataType::kInt32;
  g.row_elements = {3};
  g.rank_rows = {1, 2};
  g.inline_result = bytes_of(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<TensorEntry> entries(1);
  entries[0].req.shape = {2, 3};
  entries[0].handle = std::make_shared<OpHandle>();
  std::vector<std::string> done;
  deliver_inline_result(g, entries, [&](const std::string& name, size_t bytes) {
    done.push_back(name + ":" + std::to_string(bytes));
  });
  ASSERT_TRUE(entries[0].handle->poll());
  EXPECT_EQ(entries[0].handle->error(), "");
  EXPECT_EQ(entries[0].handle->result().output_shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(entries[0].handle->result().output.size(), 36u);
  EXPECT_EQ(done, std::vector<std::string>{"g:36"});
  // Broadcast: into the caller's output.
  Response b;
  b.type = OpType::kBroadcast;
  b.names = {"b"};
  b.dtype = DataType::kFloat64;
  b.counts = {2};
  b.inline_result = bytes_of(std::vector<double>{0.5, -2});
  std::vector<double> out(2, 0);
  std::vector<TensorEntry> be(1);
  be[0].output = out.data();
  be[0].handle = std::make_shared<OpHandle>();
  deliver_inline_result(b, be, {});
  EXPECT_EQ(out, (std::vector<double>{0.5, -2}));
  // A result that does not fit what the response says is a protocol error, not a wild copy.
  b.inline_result.pop_back();
  be[0].handle = std::make_shared<OpHandle>();
  EXPECT_THROW(deliver_inline_result(b, be, {}), ProtocolError);
  EXPECT_FALSE(be[0].handle->poll());
}

TEST(ControlInline, InputsArrivedMeansEveryInputTheResultNeeds) {
  std::vector<std::optional<Request>> by_rank = {allreduce_with<float>("t", {1}, DataType::kFloat32),
                                                 std::nullopt,  // joined
                                                 allreduce_with<float>("t", {2}, DataType::kFloat32)};
  EXPECT_TRUE(inline_inputs_arrived(by_rank));
  by_rank[2]->inline_input.clear();
  EXPECT_FALSE(inline_inputs_arrived(by_rank));
  for (auto& r : by_rank)
    if (r) { r->type = OpType::kBroadcast; r->root = 0; }
  EXPECT_TRUE(inline_inputs_arrived(by_rank));  // only the root's is needed
  by_rank[0]->root = by_rank[2]->root = 2;
  EXPECT_FALSE(inline_inputs_arrived(by_rank));
  by_rank[0]->type = by_rank[2]->type = OpType::kReducescatter;
  by_rank[2]->inline_input = "x";
  EXPECT_FALSE(inline_inputs_arrived(by_rank));
  EXPECT_FALSE(inline_inputs_arrived({std::nullopt, std::nullopt}));
}

TEST(ControlInline, ResultsPastOneMessagesBudgetGoToTheRails) {
  std::vector<Response> rs(5);
  rs[0].inline_result.assign(kControlInlineBytesPerMessage / 2, 'a');
  rs[1].inline_result.assign(kControlInlineBytesPerMessage / 4, 'b');
  rs[2].inline_result.assign(kControlInlineBytesPerMessage / 2, 'c');  // does not fit any more
  rs[3].inline_result.assign(kControlInlineBytesPerMessage / 4, 'd');  // still fits
  rs[4].inline_result.assign(1, 'e');                                  // over by one byte
  spill_inline_results(rs);
  EXPECT_EQ(rs[0].inline_result.size(), kControlInlineBytesPerMessage / 2);
  EXPECT_EQ(rs[1].inline_result.size(), kControlInlineBytesPerMessage / 4);
  EXPECT_TRUE(rs[2].inline_result.empty());
  EXPECT_EQ(rs[3].inline_result.size(), kControlInlineBytesPerMessage / 4);
  EXPECT_TRUE(rs[4].inline_result.empty());
}

CoordinatorOptions options(int size) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_s = 0.005;
  return o;
}

TEST(ControlInlineCoordinator, ReducedTensorsGoAloneAndTheOthersStillFuse) {
  Coordinator c(options(2));
  for (int rank = 0; rank < 2; ++rank) {
    Request b = allreduce_with<float>("b", {1, 1}, DataType::kFloat32);
    Request d = allreduce_with<float>("d", {1, 1}, DataType::kFloat32);
    b.inline_input.clear();
    d.inline_input.clear();
    c.submit(rank, {allreduce_with<float>("a", {1, 2}, DataType::kFloat32), b, d,
                    allreduce_with<float>("e", {10, 20.0f + rank}, DataType::kFloat32)}, t0);
  }
  std::vector<Response> out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].names, std::vector<std::string>{"a"});
  EXPECT_EQ(values_of<float>(out[0].inline_result), (std::vector<float>{2, 4}));
  EXPECT_EQ(out[1].names, (std::vector<std::string>{"b", "d"}));  // fused, for the rails
  EXPECT_TRUE(out[1].inline_result.empty());
  EXPECT_EQ(out[2].names, std::vector<std::string>{"e"});
  EXPECT_EQ(values_of<float>(out[2].inline_result), (std::vector<float>{20, 41}));
}

TEST(ControlInlineCoordinator, ReducedTensorsInARowShareOneResponseAndResult) {
  // A small grouped allreduce (a pytree of scalars): one response, one result, cut back per tensor.
  Coordinator c(options(2));
  for (int rank = 0; rank < 2; ++rank) {
    Request max = allreduce_with<float>("d", {5, float(rank)}, DataType::kFloat32, ReduceOp::kMax);
    c.submit(rank, {allreduce_with<float>("a", {1, 2}, DataType::kFloat32),
                    allreduce_with<float>("b", {10.0f * rank}, DataType::kFloat32),
                    allreduce_with<int32_t>("c", {7}, DataType::kInt32), max,
                    allreduce_with<float>("e", {3}, DataType::kFloat32)}, t0);
  }
  std::vector<Response> out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 4u);  // a+b; c (another dtype); d (another op); e (not next to a+b)
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(out[0].counts, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(out[0].cache_ids.size(), 2u);
  EXPECT_EQ(values_of<float>(out[0].inline_result), (std::vector<float>{2, 4, 10}));
  EXPECT_EQ(out[1].names, std::vector<std::string>{"c"});
  EXPECT_EQ(values_of<int32_t>(out[1].inline_result), std::vector<int32_t>{14});
  EXPECT_EQ(values_of<float>(out[2].inline_result), (std::vector<float>{5, 1}));
  EXPECT_EQ(out[3].names, std::vector<std::string>{"e"});
  // Every rank cuts the merged result back into each tensor's output.
  std::vector<float> a(2), b(1);
  std::vector<TensorEntry> entries(2);
  entries[0].output = a.data();
  entries[1].output = b.data();
  for (auto& e : entries) e.handle = std::make_shared<OpHandle>();
  deliver_inline_result(out[0], entries, {});
  EXPECT_EQ(a, (std::vector<float>{2, 4}));
  EXPECT_EQ(b, std::vector<float>{10});
  EXPECT_TRUE(entries[0].handle->poll() && entries[1].handle->poll());
}

TEST(ControlInlineCoordinator, ReducedTensorsMergeOnlyWithinTheFusionThreshold) {
  for (size_t threshold : {size_t{0}, size_t{8}, size_t{12}}) {
    CoordinatorOptions o = options(2);
    o.fusion_threshold = threshold;
    Coordinator c(o);
    for (int rank = 0; rank < 2; ++rank)
      c.submit(rank, {allreduce_with<float>("a", {1}, DataType::kFloat32),
                      allreduce_with<float>("b", {2}, DataType::kFloat32),
                      allreduce_with<float>("c", {3}, DataType::kFloat32)}, t0);
    std::vector<Response> out = c.take_ready(t0);
    // 0 (fusion off): one response each; 8 bytes: a+b, then c; 12: all three.
    ASSERT_EQ(out.size(), threshold == 0 ? 3u : threshold == 8 ? 2u : 1u) << threshold;
    std::string all;
    for (const auto& r : out) all += r.inline_result;
    EXPECT_EQ(values_of<float>(all), (std::vector<float>{2, 4, 6})) << threshold;
  }
}

TEST(ControlInlineCoordinator, MergedResultsStayWithinAControlMessagesStringLimit) {
  // 100 allreduces of 1 KB each, submitted together: merged into one result they would be 100 KB,
  // past what one string of a control message may carry (the engine stopped on encoding it).
  Coordinator c(options(2));
  const std::vector<float> kb(256, 1.0f);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<Request> reqs;
    for (int i = 0; i < 100; ++i)
      reqs.push_back(allreduce_with<float>("t" + std::to_string(i), kb, DataType::kFloat32));
    c.submit(rank, std::move(reqs), t0);
  }
  std::vector<Response> out = c.take_ready(t0);
  size_t tensors = 0;
  for (const auto& r : out) {
    EXPECT_LE(r.inline_result.size(), kMaxControlString);
    EXPECT_EQ(r.inline_result.size(), r.names.size() * kb.size() * sizeof(float));
    ResponseList list;
    list.responses = {r};
    EXPECT_NO_THROW(encode(list));
    tensors += r.names.size();
  }
  EXPECT_EQ(tensors, 100u);
  EXPECT_GE(out.size(), 2u);
}

TEST(ControlInlineCoordinator, ReducedTensorsMergeWhileOthersWaitToFuse) {
  Coordinator c(options(2));
  for (int rank = 0; rank < 2; ++rank)
    c.submit(rank, {allreduce_with<float>("x", {1}, DataType::kFloat32),
                    allreduce_with<float>("y", {2}, DataType::kFloat32)}, t0);
  c.submit(0, {allreduce_with<float>("partial", {1}, DataType::kFloat32)}, t0);  // rank 1 not yet
  std::vector<Response> now = c.take_ready(t0 + std::chrono::microseconds(100));
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(values_of<float>(now[0].inline_result), (std::vector<float>{2, 4}));
}

TEST(ControlInlineCoordinator, DoneTensorsAreNotHeldWhileOthersWaitToFuse) {
  Coordinator c(options(2));
  Request big = allreduce_with<float>("big", {1, 2}, DataType::kFloat32);
  big.inline_input.clear();  // over the limit: for the rails
  for (int rank = 0; rank < 2; ++rank)
    c.submit(rank, {big, allreduce_with<float>("small", {1, 2}, DataType::kFloat32)}, t0);
  c.submit(0, {allreduce_with<float>("partial", {1}, DataType::kFloat32)}, t0);  // rank 1 not yet
  // Within the cycle time: "big" waits for "partial" to fuse with it, "small" goes at once.
  std::vector<Response> now = c.take_ready(t0 + std::chrono::microseconds(100));
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].names, std::vector<std::string>{"small"});
  EXPECT_EQ(values_of<float>(now[0].inline_result), (std::vector<float>{2, 4}));
  Request partial = allreduce_with<float>("partial", {1}, DataType::kFloat32);
  partial.inline_input.clear();
  c.submit(1, {partial}, t0 + std::chrono::microseconds(200));
  std::vector<Response> later = c.take_ready(t0 + std::chrono::microseconds(300));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].names, (std::vector<std::string>{"big", "partial"}));  // fused, for the rails
}

TEST(ControlInlineCoordinator, BriefRequestsOfTheResponseCacheKeepTheirInputs) {
  Coordinator c(options(2));
  for (int rank = 0; rank < 2; ++rank) c.submit(rank, {allreduce_with<int32_t>("x", {rank, 1}, DataType::kInt32)}, t0);
  std::vector<Response> first = c.take_ready(t0);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_GE(first[0].cache_ids.at(0), 0);
  EXPECT_EQ(values_of<int32_t>(first[0].inline_result), (std::vector<int32_t>{1, 2}));
  for (int rank = 0; rank < 2; ++rank) {
    Request brief;
    brief.name = "x";
    brief.cache_id = first[0].cache_ids[0];
    brief.inline_input = bytes_of(std::vector<int32_t>{5 * rank, 7});
    c.submit(rank, {brief}, t0);
  }
  std::vector<Response> second = c.take_ready(t0);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(values_of<int32_t>(second[0].inline_result), (std::vector<int32_t>{5, 14}));
}

TEST(ControlInlineCoordinator, AReductionThatThrowsLeavesTheTensorToTheRails) {
  // Engines refuse bool with a scale factor at submission; rank 0 must not stop if one gets here.
  Coordinator c(options(2));
  for (int rank = 0; rank < 2; ++rank) {
    Request r = allreduce_with<uint8_t>("flags", {0, 1}, DataType::kBool);
    r.prescale = 2;
    c.submit(rank, {r}, t0);
  }
  std::vector<Response> out;
  ASSERT_NO_THROW(out = c.take_ready(t0));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kExecute);
  EXPECT_TRUE(out[0].inline_result.empty());
}

TEST(ControlInlineCoordinator, AMismatchIsAnErrorWithNoResult) {
  Coordinator c(options(2));
  c.submit(0, {allreduce_with<float>("m", {1, 2}, DataType::kFloat32)}, t0);
  c.submit(1, {allreduce_with<float>("m", {1, 2, 3}, DataType::kFloat32)}, t0);
  std::vector<Response> out = c.take_ready(t0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, Response::Kind::kError);
  EXPECT_TRUE(out[0].inline_result.empty());
}

}  // namespace
}  // namespace nezha::engine
