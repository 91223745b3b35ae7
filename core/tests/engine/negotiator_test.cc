// Negotiator alone: a control channel that connects to no one, and links that log what the
// executor and failover would be handed. Checks the order of the stream (responses and rank 0's
// rail events, with the watermark), the hand-over of submitted entries, the counters, shutdown, and
// what a worker does with rank 0's lists.
#include "engine/negotiation/negotiator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace nezha::engine {
namespace {

Request allreduce(const std::string& name, int64_t count = 4) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = name;
  r.shape = {count};
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  return r;
}

// One rank's negotiator over one rail, with every link logged in one sequence.
struct Harness {
  explicit Harness(int rank = 0, int size = 1)
      : control({{"lo", "127.0.0.1"}}, "secret", rank, size, 1 << 16), sets(size) {
    std::vector<multirail::RailDescription> described(1);
    described[0].name = "lo";
    table = std::make_unique<multirail::RailTable>(described, multirail::RailCostModelOptions{});
    NegotiatorLinks links;
    links.execute = [this](const Response& r, std::vector<TensorEntry> entries) {
      std::string names;
      for (const auto& n : r.names) names += (names.empty() ? "" : ",") + n;
      log.push_back("execute " + names);
      for (auto& e : entries) executed.push_back(std::move(e));
    };
    links.skip = [this](const Response&) { log.push_back("skip"); };
    links.trim = [this](const std::vector<uint64_t>& w) { log.push_back("trim " + std::to_string(w.at(0))); };
    links.completed = [] { return std::vector<uint64_t>{}; };
    links.watermark = [this] { return watermark; };
    links.completed_from = [](int, const std::vector<uint64_t>&) {};
    links.rail_events_from = [](int, const std::vector<RailEvent>&) {};
    links.apply_rail_event = [this](const RailEvent& e) {
      log.push_back("rail event " + std::to_string(static_cast<int>(e.kind)));
    };
    links.fail = [this](const std::string& reason) { log.push_back("fail " + reason); };
    NegotiatorOptions opt;
    opt.rank = rank;
    opt.size = size;
    opt.rail_names = {"lo"};
    opt.coordinator.size = size;
    opt.coordinator.cycle_time_s = 0;
    opt.coordinator.process_sets = &sets;
    opt.rounds.rank = rank;
    opt.rounds.size = size;
    opt.rounds.enabled = false;
    negotiator = std::make_unique<Negotiator>(opt, control, *table, submissions, sets, timeline, std::move(links));
  }

  std::shared_ptr<OpHandle> submit(const std::string& name, const void* input = nullptr) {
    std::vector<TensorEntry> one(1);
    one[0].req = allreduce(name);
    one[0].input = input;
    return submissions.add(std::move(one), [](const std::string&) {}).at(0);
  }
  // One pass of the loop as far as negotiation goes.
  bool pass() {
    negotiator->forward_new_work();
    return negotiator->coordinate(Clock::now());
  }

  ControlChannel control;
  ProcessSetTable sets;
  std::unique_ptr<multirail::RailTable> table;
  Submissions submissions;
  Timeline timeline;
  std::vector<uint64_t> watermark;
  std::vector<std::string> log;
  std::vector<TensorEntry> executed;
  std::unique_ptr<Negotiator> negotiator;
};

TEST(Negotiator, RankZeroExecutesResponsesAndRailEventsInTheOrderItSendsThem) {
  Harness h;
  h.watermark = {7};
  h.submit("a");
  EXPECT_FALSE(h.pass());
  h.negotiator->broadcast_in_order({{RailEventKind::kDown, 0, -1, 0, "gone"}});
  h.submit("b");
  EXPECT_FALSE(h.pass());
  // Every list carries the watermark; its rail events come before its responses.
  EXPECT_EQ(h.log, (std::vector<std::string>{"trim 7", "execute a", "rail event 1", "trim 7", "trim 7",
                                             "execute b"}));
}

TEST(Negotiator, HandsTheSubmittedEntriesOverAndCountsThem) {
  Harness h;
  const float input[4] = {1, 2, 3, 4};
  auto handle = h.submit("a", input);
  h.submit("b");
  h.pass();
  ASSERT_EQ(h.executed.size(), 2u);  // one response (fused) or two: both entries, in order
  EXPECT_EQ(h.executed[0].req.name, "a");
  EXPECT_EQ(h.executed[0].input, input);
  EXPECT_EQ(h.executed[0].handle, handle);
  EXPECT_EQ(h.executed[1].req.name, "b");
  EXPECT_FALSE(h.submissions.any_in_flight({"a", "b"}));
  const NegotiatorStats s = h.negotiator->stats();
  EXPECT_EQ(s.requests_to_coordinator, 2u);
  EXPECT_EQ(s.tensors_via_coordinator, 2u);
  EXPECT_EQ(s.tensors_via_rounds, 0u);
  EXPECT_GE(s.operations_on_rails, 1u);
}

TEST(Negotiator, CoordinationEndsOnceEveryRankAskedToShutDown) {
  Harness h;
  EXPECT_FALSE(h.pass());
  h.submissions.request_shutdown();
  EXPECT_TRUE(h.pass());
}

TEST(Negotiator, WorkerRunsRankZerosListAfterItsRailEvents) {
  Harness h(/*rank=*/1, /*size=*/2);
  h.submit("a");
  ResponseList list;
  list.rail_events.push_back({RailEventKind::kRedo, 0, 0, 3, ""});
  Response r;
  r.kind = Response::Kind::kExecute;
  r.type = OpType::kAllreduce;
  r.names = {"a"};
  r.counts = {4};
  r.dtype = DataType::kFloat32;
  list.responses.push_back(r);
  EXPECT_FALSE(h.negotiator->on_control_message(0, encode(list)));
  EXPECT_EQ(h.log, (std::vector<std::string>{"rail event 3", "execute a"}));
  EXPECT_EQ(h.negotiator->stats().tensors_via_coordinator, 1u);
}

TEST(Negotiator, WorkerRefusesWhatOnlyRankZeroMaySendOrWhatItNeverSubmitted) {
  Harness h(/*rank=*/1, /*size=*/3);
  EXPECT_THROW(h.negotiator->on_control_message(2, encode(ResponseList{})), ProtocolError);
  ResponseList list;
  Response r;
  r.kind = Response::Kind::kExecute;
  r.type = OpType::kAllreduce;
  r.names = {"never"};
  r.counts = {4};
  list.responses.push_back(r);
  EXPECT_THROW(h.negotiator->on_control_message(0, encode(list)), ProtocolError);
}

TEST(Negotiator, WorkerEndsOnRankZerosGoodbyeOrFatal) {
  Harness h(/*rank=*/1, /*size=*/2);
  ResponseList fatal;
  fatal.fatal = "rank 3 is gone";
  EXPECT_TRUE(h.negotiator->on_control_message(0, encode(fatal)));
  EXPECT_EQ(h.log, (std::vector<std::string>{"fail rank 3 is gone"}));
  Harness g(/*rank=*/1, /*size=*/2);
  ResponseList bye;
  bye.shutdown = true;
  EXPECT_TRUE(g.negotiator->on_control_message(0, encode(bye)));
}

}  // namespace
}  // namespace nezha::engine
