// Submissions alone: what callers may queue, what negotiation takes out, and how a failure or a
// shutdown completes what is left.
#include "engine/submissions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace nezha::engine {
namespace {

std::vector<TensorEntry> entries(const std::vector<std::string>& names, int32_t process_set = 0) {
  std::vector<TensorEntry> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].req.type = names[i] == kJoinTensorName ? OpType::kJoin : OpType::kAllreduce;
    out[i].req.name = names[i];
    out[i].req.process_set = process_set;
  }
  return out;
}

const auto ignore = [](const std::string&) {};

TEST(Submissions, QueuesAllOrNoneAndRefusesANameInFlight) {
  Submissions s;
  std::vector<std::string> added;
  auto handles = s.add(entries({"a", "b"}), [&](const std::string& n) { added.push_back(n); });
  ASSERT_EQ(handles.size(), 2u);
  EXPECT_NE(handles[0], handles[1]);
  EXPECT_EQ(added, (std::vector<std::string>{"a", "b"}));
  EXPECT_THROW(s.add(entries({"c", "a"}), ignore), InvalidArgument);  // a is in flight
  EXPECT_THROW(s.add(entries({"d", "d"}), ignore), InvalidArgument);  // twice in one group
  EXPECT_FALSE(s.in_flight("c"));  // nothing of a refused group was queued
  EXPECT_FALSE(s.in_flight("d"));
}

TEST(Submissions, DrainHandsNewNamesOnceAndTakeEmptiesThem) {
  Submissions s;
  s.add(entries({"a", "b"}), ignore);
  std::vector<std::string> drained;
  EXPECT_FALSE(s.drain_new([&](const std::string& n, const TensorEntry& e) {
    EXPECT_EQ(n, e.req.name);
    drained.push_back(n);
  }));
  EXPECT_EQ(drained, (std::vector<std::string>{"a", "b"}));
  drained.clear();
  s.drain_new([&](const std::string& n, const TensorEntry&) { drained.push_back(n); });
  EXPECT_TRUE(drained.empty());

  s.requeue({"b"});
  s.drain_new([&](const std::string& n, const TensorEntry&) { drained.push_back(n); });
  EXPECT_EQ(drained, (std::vector<std::string>{"b"}));

  std::vector<size_t> seen;
  Submissions::Taken t = s.take({"b", "x", "a"}, [&](size_t i, const TensorEntry&) { seen.push_back(i); });
  EXPECT_EQ(seen, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(t.present, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(t.entries[0].req.name, "b");
  EXPECT_EQ(t.entries[2].req.name, "a");
  EXPECT_FALSE(t.join_in_flight);
  EXPECT_FALSE(s.any_in_flight({"a", "b"}));
  s.add(entries({"a"}), ignore);  // the name is free again
}

TEST(Submissions, TakeSaysWhetherAJoinIsInFlight) {
  Submissions s;
  s.add(entries({kJoinTensorName}), ignore);
  EXPECT_TRUE(s.take({"never submitted"}, [](size_t, const TensorEntry&) {}).join_in_flight);
}

TEST(Submissions, ASetWithTensorsInFlightIsNotRemoved) {
  Submissions s;
  s.add(entries({"a"}, /*process_set=*/3), ignore);
  bool removed = false;
  EXPECT_THROW(s.remove_set_if_idle(3, [&] { return removed = true; }), InvalidArgument);
  EXPECT_FALSE(removed);
  EXPECT_TRUE(s.remove_set_if_idle(4, [&] { return removed = true; }));
  EXPECT_TRUE(removed);
}

TEST(Submissions, FailureCompletesEveryHandleAndRefusesMoreWithTheFirstReason) {
  Submissions s;
  auto h = s.add(entries({"a"}), ignore);
  s.fail_all("rank 2 is unreachable");
  s.fail_all("a later reason");
  ASSERT_TRUE(h[0]->poll());
  EXPECT_NE(h[0]->error().find("tensor 'a': rank 2 is unreachable"), std::string::npos);
  try {
    s.add(entries({"b"}), ignore);
    FAIL() << "add after a failure must throw";
  } catch (const NezhaError& e) {
    EXPECT_EQ(std::string(e.what()), "rank 2 is unreachable");
  }
}

TEST(Submissions, ShutdownRefusesNewWorkAndCloseCompletesTheRest) {
  Submissions s;
  auto h = s.add(entries({"a"}), ignore);
  s.request_shutdown();
  EXPECT_TRUE(s.shutdown_requested());
  EXPECT_TRUE(s.drain_new([](const std::string&, const TensorEntry&) {}));
  EXPECT_THROW(s.add(entries({"b"}), ignore), InvalidArgument);
  s.close();
  ASSERT_TRUE(h[0]->poll());
  EXPECT_NE(h[0]->error().find("shut down before tensor 'a'"), std::string::npos);
}

}  // namespace
}  // namespace nezha::engine
