// FailoverController alone: a fake executor (RailWork) and fake links record what it asks for, so
// its event handling, the watermark and the application of rank 0's decisions are checked without
// rails, workers or a control channel.
#include "engine/failover/failover_controller.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

namespace nezha::engine {
namespace {

// A rail that only records what failover does to it: the base contract alone (rail.h), neither point
// to point nor collective, since failover makes no data call.
class RecordingRail : public transport::Rail {
 public:
  explicit RecordingRail(std::string name) { props_.name = std::move(name); }
  const transport::RailProperties& properties() const override { return props_; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string local_address() const override { return "here"; }
  void connect(const std::vector<std::string>& addresses, const Deadline&) override { connected_to = addresses; }
  void reset() override { ++resets; }
  void close() override {}
  transport::RailCounters counters() const override { return {}; }
  void abort(const std::string& reason) override { aborts.push_back(reason); }

  std::vector<std::string> aborts;
  int resets = 0;
  std::vector<std::string> connected_to;

 private:
  transport::RailProperties props_;
};

// One rank's controller over three rails, with everything it reaches recorded.
struct Harness {
  explicit Harness(int rank, int size = 2, bool enabled = true) {
    std::vector<multirail::RailDescription> described(3);
    for (int i = 0; i < 3; ++i) described[i].name = "r" + std::to_string(i);
    table = std::make_unique<multirail::RailTable>(described, multirail::RailCostModelOptions{});
    for (int i = 0; i < 3; ++i) rails.push_back(std::make_unique<RecordingRail>("r" + std::to_string(i)));
    completed.assign(3, 0);
    running.assign(3, 0);

    RailWork work;
    work.completed = [this] { return completed; };
    work.running = [this](int rail) { return running[rail]; };
    work.post_task = [this](int, std::function<void()> task) { tasks.push_back(std::move(task)); };
    work.post_probe = [this](int rail, size_t bytes, std::function<void()> prepare,
                             std::function<void(const std::string&)> done) {
      probes.push_back({rail, bytes});
      prepare();
      done(probe_error);
    };
    work.redo = [this](int rail, uint64_t first, int target) { redos.push_back({rail, first, target}); };
    FailoverLinks links;
    links.avoid_path = [this](int rail, bool avoid) { avoided.push_back({rail, avoid}); };
    links.send_to_coordinator = [this](std::vector<RailEvent> e) { sent.push_back(std::move(e)); };
    links.broadcast_in_order = [this](std::vector<RailEvent> e) { broadcast.push_back(std::move(e)); };
    links.wake = [this] { ++wakes; };
    FailoverOptions opt;
    opt.rank = rank;
    opt.size = size;
    opt.enabled = enabled;
    opt.health.initial_backoff = std::chrono::milliseconds(10);
    for (int r = 0; r < size; ++r) opt.rail_addrs_by_rank.push_back({"a" + std::to_string(r), "b", "c"});
    std::vector<transport::Rail*> raw;
    for (auto& r : rails) raw.push_back(r.get());
    controller = std::make_unique<FailoverController>(opt, raw, *table, std::move(work), std::move(links));
  }
  void run_tasks() {
    while (!tasks.empty()) {
      auto t = std::move(tasks.front());
      tasks.pop_front();
      t();
    }
  }

  std::unique_ptr<multirail::RailTable> table;
  std::vector<std::unique_ptr<RecordingRail>> rails;
  std::vector<uint64_t> completed, running;
  std::deque<std::function<void()>> tasks;
  struct Probe { int rail; size_t bytes; };
  std::vector<Probe> probes;
  std::string probe_error;
  struct Redo { int rail; uint64_t first; int target; };
  std::vector<Redo> redos;
  std::vector<std::pair<int, bool>> avoided;
  std::vector<std::vector<RailEvent>> sent, broadcast;
  int wakes = 0;
  std::unique_ptr<FailoverController> controller;
};

RailEvent failed(int rail, uint64_t stalled_seq_plus_one = 0) {
  return {RailEventKind::kFailed, rail, -1, stalled_seq_plus_one, "boom"};
}

TEST(FailoverController, WorkerSendsAnErrorOnceAndKeepsTheControlChannelOffTheRail) {
  Harness h(/*rank=*/1);
  h.controller->report(failed(1));
  h.controller->report(failed(1));  // the same rail's next share failing too
  EXPECT_EQ(h.wakes, 2);
  EXPECT_TRUE(h.sent.empty());  // queued only: the loop sends
  h.controller->handle_reports();
  ASSERT_EQ(h.sent.size(), 1u);
  ASSERT_EQ(h.sent[0].size(), 1u);
  EXPECT_EQ(h.sent[0][0].kind, RailEventKind::kFailed);
  EXPECT_EQ(h.sent[0][0].rail, 1);
  EXPECT_EQ(h.avoided, (std::vector<std::pair<int, bool>>{{1, true}}));

  h.controller->report(failed(1));  // still the same failure: dropped
  h.controller->handle_reports();
  EXPECT_EQ(h.sent.size(), 1u);
  // Back up (rank 0's kUp): a new failure is news again, and the control channel may use it.
  h.controller->apply({RailEventKind::kUp, 1, -1, 0, ""});
  EXPECT_EQ(h.avoided.back(), (std::pair<int, bool>{1, false}));
  h.controller->report(failed(1));
  h.controller->handle_reports();
  EXPECT_EQ(h.sent.size(), 2u);
}

TEST(FailoverController, StallOnTheLastUsableRailIsNotReported) {
  Harness h(/*rank=*/1);
  h.table->set_state(0, multirail::RailState::kDown);
  h.table->set_state(2, multirail::RailState::kDown);
  h.controller->report(failed(1, /*seq 4 stalled*/ 5));
  h.controller->handle_reports();
  EXPECT_TRUE(h.sent.empty());
  h.table->set_state(2, multirail::RailState::kUp);  // two usable: the stall is worth checking
  h.controller->report(failed(1, 5));
  h.controller->report(failed(1, 6));  // stalls are reported once per stalled operation
  h.controller->handle_reports();
  ASSERT_EQ(h.sent.size(), 1u);
  EXPECT_EQ(h.sent[0].size(), 2u);
}

TEST(FailoverController, WatermarkIsTheLeastCompletedOverRanks) {
  Harness h(/*rank=*/0, /*size=*/3);
  h.completed = {9, 4, 7};
  EXPECT_EQ(h.controller->watermark(), (std::vector<uint64_t>{0, 0, 0}));  // nobody reported yet
  h.controller->on_completed_from(1, {5, 6, 7});
  h.controller->on_completed_from(2, {8, 3, 9});
  EXPECT_EQ(h.controller->watermark(), (std::vector<uint64_t>{5, 3, 7}));
  h.controller->on_completed_from(2, {1, 2});  // not one count per rail (a heartbeat without them)
  EXPECT_EQ(h.controller->watermark(), (std::vector<uint64_t>{5, 3, 7}));
  EXPECT_EQ(h.controller->completed_if_enabled(), h.completed);
}

TEST(FailoverController, OffItHasNoWatermarkAndRefusesRailEvents) {
  Harness h(/*rank=*/0, /*size=*/2, /*enabled=*/false);
  h.completed = {3, 3, 3};
  h.controller->on_completed_from(1, {1, 1, 1});
  EXPECT_TRUE(h.controller->watermark().empty());
  EXPECT_TRUE(h.controller->completed_if_enabled().empty());
  EXPECT_FALSE(h.controller->next_wakeup().has_value());
  EXPECT_THROW(h.controller->on_events_from(1, {failed(0)}), ProtocolError);
}

TEST(FailoverController, DownAbortsTheRailAndReportsHowFarItGotOnceDrained) {
  Harness h(/*rank=*/1);
  h.completed = {4, 11, 2};
  h.controller->apply({RailEventKind::kDown, 1, -1, 0, "rail 'r1' failed on rank 0: boom"});
  EXPECT_EQ(h.table->state(1), multirail::RailState::kDown);
  ASSERT_EQ(h.rails[1]->aborts.size(), 1u);
  EXPECT_TRUE(h.sent.empty());
  h.completed[1] = 12;  // the worker finishes what it had, then runs the drained task
  h.run_tasks();
  h.controller->handle_reports();
  ASSERT_EQ(h.sent.size(), 1u);
  EXPECT_EQ(h.sent[0][0].kind, RailEventKind::kDrained);
  EXPECT_EQ(h.sent[0][0].value, 12u);
}

TEST(FailoverController, QueryReplySaysWhetherThisRankIsBehindTheStalledOperation) {
  Harness h(/*rank=*/1);
  h.completed = {0, 7, 0};
  h.controller->apply({RailEventKind::kQuery, 1, -1, /*seq=*/7, ""});  // not completed, not running
  h.running[1] = 8;
  h.controller->apply({RailEventKind::kQuery, 1, -1, 7, ""});  // running it: not behind
  h.controller->apply({RailEventKind::kQuery, 1, -1, 6, ""});  // completed it: not behind
  h.controller->handle_reports();
  ASSERT_EQ(h.sent.size(), 1u);
  ASSERT_EQ(h.sent[0].size(), 3u);
  EXPECT_EQ(h.sent[0][0].kind, RailEventKind::kQueryReply);
  EXPECT_EQ(h.sent[0][0].target, 1);
  EXPECT_EQ(h.sent[0][0].value, 7u);
  EXPECT_EQ(h.sent[0][1].target, 0);
  EXPECT_EQ(h.sent[0][2].target, 0);
}

TEST(FailoverController, RankZeroTakesARailDownRedoesItsWorkAndReadmitsIt) {
  Harness h(/*rank=*/0);
  h.completed = {0, 5, 0};
  h.controller->report(failed(1));
  h.controller->handle_reports();  // rank 0's own report goes straight to its decision
  ASSERT_EQ(h.broadcast.size(), 1u);
  ASSERT_EQ(h.broadcast[0][0].kind, RailEventKind::kDown);
  h.controller->apply(h.broadcast[0][0]);  // as the stream would hand it back
  h.run_tasks();
  h.controller->handle_reports();  // rank 0 drained at 5
  h.controller->on_events_from(1, {{RailEventKind::kDrained, 1, -1, 3, ""}});
  ASSERT_EQ(h.broadcast.size(), 2u);
  const RailEvent redo = h.broadcast[1][0];
  EXPECT_EQ(redo.kind, RailEventKind::kRedo);
  EXPECT_EQ(redo.value, 3u);  // the first share rank 1 has not completed
  h.controller->apply(redo);
  ASSERT_EQ(h.redos.size(), 1u);
  EXPECT_EQ(h.redos[0].rail, 1);
  EXPECT_EQ(h.redos[0].first, 3u);
  EXPECT_EQ(h.redos[0].target, redo.target);
  EXPECT_NE(redo.target, 1);

  // Re-admission: after the back-off, probe (reset), connect (with the data rail's addresses), up.
  auto due = h.controller->next_wakeup();
  ASSERT_TRUE(due.has_value());
  h.controller->start_due_probes(*due + std::chrono::seconds(1));
  ASSERT_EQ(h.broadcast.size(), 3u);
  h.controller->apply(h.broadcast[2][0]);
  EXPECT_EQ(h.table->state(1), multirail::RailState::kProbing);
  h.run_tasks();
  EXPECT_EQ(h.rails[1]->resets, 1);
  h.controller->handle_reports();
  h.controller->on_events_from(1, {{RailEventKind::kProbeReady, 1, -1, 0, ""}});
  ASSERT_EQ(h.broadcast.size(), 4u);
  ASSERT_EQ(h.broadcast[3][0].kind, RailEventKind::kConnect);
  h.controller->apply(h.broadcast[3][0]);
  EXPECT_EQ(h.rails[1]->connected_to, (std::vector<std::string>{"b", "b"}));
  ASSERT_EQ(h.probes.size(), 1u);
  h.controller->handle_reports();
  h.controller->on_events_from(1, {{RailEventKind::kProbeResult, 1, -1, 1, ""}});
  ASSERT_EQ(h.broadcast.size(), 5u);
  EXPECT_EQ(h.broadcast[4][0].kind, RailEventKind::kUp);
  h.controller->apply(h.broadcast[4][0]);
  EXPECT_EQ(h.table->state(1), multirail::RailState::kUp);
}

TEST(FailoverController, EventsNamingNoSuchRailOrTheWrongDirectionAreProtocolErrors) {
  Harness h(/*rank=*/0);
  EXPECT_THROW(h.controller->apply({RailEventKind::kDown, 3, -1, 0, ""}), ProtocolError);
  EXPECT_THROW(h.controller->apply({RailEventKind::kRedo, 1, 7, 0, ""}), ProtocolError);
  EXPECT_THROW(h.controller->apply({RailEventKind::kDrained, 1, -1, 0, ""}), ProtocolError);
  EXPECT_THROW(h.controller->on_events_from(1, {{RailEventKind::kDown, 1, -1, 0, ""}}), ProtocolError);
}

}  // namespace
}  // namespace nezha::engine
