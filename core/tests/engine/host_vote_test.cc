// Host votes end to end (negotiation/host_vote.h): engines as threads of one process on one host.
// A synchronous caller's small cached allreduce is agreed and reduced on the host board with exact
// results; a rank that submits it otherwise (asynchronously, with other metadata) or joins sends
// everyone to rank 0 and nothing hangs or is lost; tensors too large, and rank 0 saying no, never
// vote.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::make_request;
using transport::testing::run_ranks;

// One float allreduce (sum): input rank * 10 + i + 1 at index i, submitted as a synchronous Python
// call submits it (a lead the caller waits out) or asynchronously.
struct Call {
  Call(int rank, size_t count) : in(count), out(count, -1) {
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 10 + i + 1);
  }
  std::shared_ptr<OpHandle> submit(Engine& e, const std::string& name, bool synchronous) {
    Request req = make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(in.size())});
    return synchronous ? testing::submit_leading(e, std::move(req), in.data(), out.data(), 0.05, /*waits_to_end=*/true)
                       : testing::submit(e, std::move(req), in.data(), out.data());
  }
  // The sum over `ranks` (zeros from the others), as a plain loop computes it.
  bool is_sum_of(const std::vector<int>& ranks) const {
    for (size_t i = 0; i < in.size(); ++i) {
      float want = 0;
      for (int r : ranks) want += static_cast<float>(r * 10 + i + 1);
      if (out[i] != want) return false;
    }
    return true;
  }
  std::vector<float> in, out;
};

std::vector<int> all_ranks(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// Every rank runs `times` calls of `name`; `synchronous(rank, i)` says how each is submitted.
// Returns the number of wrong or failed results.
int run_calls(Cluster& c, const std::string& name, size_t count, int times,
              const std::function<bool(int, int)>& synchronous) {
  std::atomic<int> bad{0};
  run_ranks(c.size(), [&](int r) {
    for (int i = 0; i < times; ++i) {
      Call call(r, count);
      auto h = call.submit(c[r], name, synchronous(r, i));
      if (!h->wait_for(10) || !h->error().empty() || !call.is_sum_of(all_ranks(c.size()))) ++bad;
    }
  });
  return bad.load();
}

TEST(HostVote, SynchronousSmallAllreducesVoteWithExactResults) {
  Cluster c(4);
  ASSERT_EQ(run_calls(c, "loss", 2, 60, [](int, int) { return true; }), 0);
  for (int r = 0; r < 4; ++r) {
    const EngineStats s = c[r].stats();
    // The first two go through rank 0: the first caches it, the second gives it a slot.
    EXPECT_EQ(s.tensors_by_host_vote, 58u) << "rank " << r;
    EXPECT_EQ(s.tensors_via_coordinator, 2u) << "rank " << r;
    EXPECT_EQ(s.host_votes_diverted, 0u) << "rank " << r;
  }
}

TEST(HostVote, ARankSubmittingAsynchronouslySendsEveryoneToRankZero) {
  Cluster c(4);
  // Rank 3 submits every third call asynchronously: from the third call on (once it has a slot),
  // those go through rank 0 on every rank.
  ASSERT_EQ(run_calls(c, "metric", 3, 30, [](int r, int i) { return !(r == 3 && i % 3 == 1); }), 0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(c[r].stats().host_votes_diverted, 9u) << "rank " << r;
    EXPECT_EQ(c[r].stats().tensors_by_host_vote, 19u) << "rank " << r;
  }
}

TEST(HostVote, OtherMetadataGoesToRankZeroThenVotesAgain) {
  Cluster c(3);
  ASSERT_EQ(run_calls(c, "m", 2, 5, [](int, int) { return true; }), 0);
  ASSERT_EQ(run_calls(c, "m", 5, 5, [](int, int) { return true; }), 0);  // re-cached with 5 elements
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(c[r].stats().tensors_by_host_vote, 7u) << "rank " << r;
    EXPECT_EQ(c[r].stats().host_votes_diverted, 1u) << "rank " << r;
  }
}

TEST(HostVote, NamesUsedOnceTakeNoSlot) {
  Cluster c(2);
  for (int i = 0; i < 2 * static_cast<int>(HostVoteBoard::kSlots); ++i)
    ASSERT_EQ(run_calls(c, "once." + std::to_string(i), 2, 1, [](int, int) { return true; }), 0);
  ASSERT_EQ(run_calls(c, "again", 2, 10, [](int, int) { return true; }), 0);  // slots are left for it
  EXPECT_EQ(c[0].stats().tensors_by_host_vote, 8u);
  EXPECT_EQ(c[1].stats().tensors_by_host_vote, 8u);
}

TEST(HostVote, InputsOverABoardAreaNeverVoteNorTakeASlot) {
  Cluster c(2);
  for (int i = 0; i < static_cast<int>(HostVoteBoard::kSlots) + 1; ++i)  // a model's gradients, say
    ASSERT_EQ(run_calls(c, "big." + std::to_string(i), HostVoteBoard::kMaxInputBytes / 4 + 1, 3,
                        [](int, int) { return true; }), 0);
  EXPECT_EQ(c[0].stats().tensors_by_host_vote, 0u);
  EXPECT_EQ(c[1].stats().tensors_by_host_vote, 0u);
  ASSERT_EQ(run_calls(c, "loss", 1, 5, [](int, int) { return true; }), 0);  // still gets a slot
  EXPECT_EQ(c[0].stats().tensors_by_host_vote, 3u);
  EXPECT_EQ(c[1].stats().tensors_by_host_vote, 3u);
}

TEST(HostVote, RankZeroDecidesForTheJob) {
  Cluster c(3, testing::loopback_rails(1), [](EngineConfig& cfg) { cfg.host_vote = cfg.rank != 0; });
  ASSERT_EQ(run_calls(c, "x", 2, 10, [](int, int) { return true; }), 0);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(c[r].stats().tensors_by_host_vote, 0u) << "rank " << r;
}

// This rank's join(), done without error.
bool joined(Engine& e) {
  Request req;
  req.type = OpType::kJoin;
  auto h = testing::submit(e, req, nullptr, nullptr);
  return h->wait_for(10) && h->error().empty();
}

TEST(HostVote, AJoinBreaksTheBoardAndCountsAsZeros) {
  Cluster c(3);
  ASSERT_EQ(run_calls(c, "j", 2, 5, [](int, int) { return true; }), 0);
  std::atomic<int> bad{0};
  run_ranks(3, [&](int r) {
    if (r == 2) {
      if (!joined(c[r])) ++bad;
      return;
    }
    Call call(r, 2);
    auto h = call.submit(c[r], "j", true);  // its vote would wait for rank 2 forever
    if (!h->wait_for(10) || !h->error().empty() || !call.is_sum_of({0, 1})) ++bad;
    if (!joined(c[r])) ++bad;
  });
  ASSERT_EQ(bad.load(), 0);
  const uint64_t before = c[0].stats().tensors_by_host_vote;
  ASSERT_EQ(run_calls(c, "j", 2, 5, [](int, int) { return true; }), 0);
  EXPECT_EQ(c[0].stats().tensors_by_host_vote, before);  // broken for good: rank 0 does them
}

}  // namespace
}  // namespace nezha::engine
