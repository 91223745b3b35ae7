// CacheRounds as a pure state machine: several ranks' instances exchange vectors through an in-memory
// network that keeps each connection FIFO but interleaves connections at random, as TCP would.
#include "engine/negotiation/cache_rounds.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"

namespace nezha::engine {
namespace {

Request allreduce(const std::string& name, int64_t count, DataType dtype = DataType::kFloat32) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = name;
  r.dtype = dtype;
  r.shape = {count};
  return r;
}

// The response rank 0 would have sent for `req`, used to teach every rank the cache entry.
Response response_for(const Request& req, int32_t id) {
  Response resp;
  resp.type = req.type;
  resp.names = {req.name};
  resp.counts = {req.num_elements()};
  resp.dtype = req.dtype;
  resp.op = req.op;
  resp.cache_ids = {id};
  return resp;
}

class Net {
 public:
  explicit Net(int size, size_t fusion_threshold = 64 << 20, unsigned seed = 1, size_t unfused_bytes = 1 << 20)
      : rng_(seed) {
    for (int r = 0; r < size; ++r) {
      CacheRoundsOptions o;
      o.rank = r;
      o.size = size;
      o.fusion_threshold = fusion_threshold;
      o.unfused_bytes = unfused_bytes;
      ranks_.emplace_back(o);
    }
    done_.resize(size);
  }
  std::vector<multirail::RailEstimate> estimates;  // what rank 0 sends with its vectors
  int size() const { return static_cast<int>(ranks_.size()); }
  CacheRounds& operator[](int r) { return ranks_[r]; }

  void learn_everywhere(const Request& req, int32_t id) {
    for (auto& r : ranks_) r.learn(id, req, response_for(req, id), 0);
  }
  void submit(int rank, const std::string& name) {
    auto d = ranks_[rank].route(allreduce(name, counts_.at(name)));
    ASSERT_EQ(d.route, CacheRounds::Route::kRound) << name;
    ranks_[rank].add_pending(d.id, now_);
  }
  void cache(const std::string& name, int64_t count, int32_t id) {
    counts_[name] = count;
    learn_everywhere(allreduce(name, count), id);
  }

  // Sends due vectors and records what becomes executable on `rank`.
  void pump(int rank) {
    for (;;) {
      if (ranks_[rank].round_due()) {
        RoundMessage m = ranks_[rank].start_round(now_, estimates);
        ++messages_;
        std::string bytes = encode(m);  // through the codec, as on the wire
        for (int p = 0; p < size(); ++p)
          if (p != rank) wire_[{rank, p}].push_back(bytes);
        continue;
      }
      auto step = ranks_[rank].next();
      if (!step) return;
      done_[rank].push_back(std::move(*step));
    }
  }
  // Delivers everything, connections interleaved at random; false if some round never completed.
  void run() {
    for (int r = 0; r < size(); ++r) pump(r);
    for (;;) {
      std::vector<std::pair<int, int>> busy;
      for (auto& [k, q] : wire_)
        if (!q.empty()) busy.push_back(k);
      if (busy.empty()) return;
      auto k = busy[std::uniform_int_distribution<size_t>(0, busy.size() - 1)(rng_)];
      std::string bytes = wire_[k].front();
      wire_[k].pop_front();
      ranks_[k.second].receive(k.first, decode_round_message(bytes));
      pump(k.second);
    }
  }
  // Names executed on `rank` by rounds, in order (fused ops flattened), "|" between ops.
  std::string executed(int rank) const {
    std::string s;
    for (const auto& st : done_[rank]) {
      if (!st.round) continue;
      for (const auto& op : st.round->ops) {
        s += s.empty() ? "" : "|";
        for (size_t i = 0; i < op.names.size(); ++i) s += (i ? "+" : "") + op.names[i];
      }
    }
    return s;
  }
  std::vector<RoundStep>& steps(int rank) { return done_[rank]; }
  int messages() const { return messages_; }
  void hold(int rank, ResponseList list) {
    ranks_[rank].hold(std::move(list));
    pump(rank);
  }

 private:
  std::vector<CacheRounds> ranks_;
  std::map<std::pair<int, int>, std::deque<std::string>> wire_;
  std::vector<std::vector<RoundStep>> done_;
  std::map<std::string, int64_t> counts_;
  std::mt19937 rng_;
  Clock::time_point now_ = Clock::now();
  int messages_ = 0;
};

TEST(CacheRoundsTest, OnlyIdsPendingOnEveryRankRun) {
  Net net(3);
  net.cache("a", 4, 0);
  net.cache("b", 4, 1);
  net.submit(0, "a");
  net.submit(0, "b");
  net.submit(1, "a");
  net.submit(2, "b");
  net.submit(2, "a");
  net.run();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(net.executed(r), "a") << "rank " << r;
  EXPECT_EQ(net[0].pending_count(), 1u);
  net.submit(1, "b");
  net.run();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(net.executed(r), "a|b") << "rank " << r;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(net[r].pending_count(), 0u);
}

TEST(CacheRoundsTest, NoRoundWithoutNewWork) {
  Net net(4);
  net.cache("a", 4, 0);
  net.submit(1, "a");
  net.run();
  const int after_first = net.messages();
  EXPECT_EQ(after_first, 4);  // rank 1 started round 1, the others answered once
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(net[r].round_due()) << "rank " << r;
  net.run();  // nothing new: nobody sends anything
  EXPECT_EQ(net.messages(), after_first);
  EXPECT_EQ(net.executed(0), "");
  for (int r : {0, 2, 3}) net.submit(r, "a");
  net.run();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(net.executed(r), "a");
}

TEST(CacheRoundsTest, DifferentSubmissionOrdersAgreeOnOneOrder) {
  for (unsigned seed = 0; seed < 20; ++seed) {
    Net net(4, 64 << 20, seed);
    std::vector<std::string> names;
    for (int i = 0; i < 12; ++i) {
      names.push_back("t" + std::to_string(i));
      net.cache(names.back(), 1 + i, i);
    }
    std::mt19937 rng(seed);
    std::vector<std::vector<std::string>> orders(4, names);
    for (auto& o : orders) std::shuffle(o.begin(), o.end(), rng);
    // Interleave submissions with delivery so rounds see partial sets.
    for (size_t i = 0; i < names.size(); ++i) {
      for (int r = 0; r < 4; ++r) net.submit(r, orders[r][i]);
      if (i % 3 == 1) net.run();
    }
    net.run();
    std::string first = net.executed(0);
    for (int r = 1; r < 4; ++r) EXPECT_EQ(net.executed(r), first) << "seed " << seed;
    for (const auto& n : names) EXPECT_NE(first.find(n), std::string::npos) << n;
  }
}

TEST(CacheRoundsTest, ReadyIdsRunInAscendingIdOrderAndFuse) {
  Net net(2, /*fusion_threshold=*/64);  // 16 floats per fused buffer
  net.cache("x", 8, 2);
  net.cache("y", 8, 0);
  net.cache("z", 8, 1);
  net.cache("big", 100, 3);
  Request d = allreduce("dbl", 2, DataType::kFloat64);
  net.learn_everywhere(d, 4);
  for (int r = 0; r < 2; ++r) {
    for (const char* n : {"x", "y", "z", "big"}) net.submit(r, n);
    net[r].add_pending(4, Clock::now());
  }
  net.run();
  // ids 0,1 fuse (64 bytes), 2 starts a new buffer, 3 exceeds the threshold alone, 4 is float64.
  EXPECT_EQ(net.executed(0), "y+z|x|big|dbl");
  EXPECT_EQ(net.executed(1), net.executed(0));
}

TEST(CacheRoundsTest, TensorsOfAtLeastUnfusedBytesRunAloneAsTheCoordinatorDecides) {
  Net net(2, /*fusion_threshold=*/1024, /*seed=*/1, /*unfused_bytes=*/64);  // float32[16] and up alone
  net.cache("a", 4, 0);
  net.cache("b", 4, 1);
  net.cache("big", 16, 2);
  net.cache("c", 15, 3);
  net.cache("d", 4, 4);
  for (int r = 0; r < 2; ++r)
    for (const char* n : {"a", "b", "big", "c", "d"}) net.submit(r, n);
  net.run();
  EXPECT_EQ(net.executed(0), "a+b|big|c+d");
  EXPECT_EQ(net.executed(1), net.executed(0));
}

TEST(CacheRoundsTest, RankZerosEstimatesScaleTheUnfusedThresholdOnEveryRank) {
  // The round's estimates say a lone operation pays 8 x 25 us x 0.1 Gbit/s = 2500 B of start-up:
  // "big" (64 B, at unfused_bytes) is fused after all, on both ranks alike.
  Net net(2, /*fusion_threshold=*/1024, /*seed=*/1, /*unfused_bytes=*/64);
  net.estimates = {multirail::RailEstimate{5, 0.1, 10, 25}};
  net.cache("a", 4, 0);
  net.cache("big", 16, 1);
  net.cache("c", 4, 2);
  for (int r = 0; r < 2; ++r)
    for (const char* n : {"a", "big", "c"}) net.submit(r, n);
  net.run();
  EXPECT_EQ(net.executed(0), "a+big+c");
  EXPECT_EQ(net.executed(1), net.executed(0));
}

TEST(CacheRoundsTest, JoinedRankCountsAsReadyUntilItsJoinCompletes) {
  Net net(3);
  net.cache("a", 4, 0);
  net[2].set_joined();
  net.submit(0, "a");
  net.submit(1, "a");
  net.run();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(net.executed(r), "a") << "rank " << r;
  // The join completes everywhere (same point of the total order); a stale joined vector from
  // rank 2 no longer counts.
  EXPECT_FALSE(net[0].join_may_complete());
  for (int r = 0; r < 3; ++r) net[r].join_completed();
  net.submit(0, "a");
  net.submit(1, "a");
  net.run();
  EXPECT_EQ(net.executed(0), "a");
  EXPECT_EQ(net[0].pending_count(), 1u);
}

TEST(CacheRoundsTest, JoinMayCompleteOnlyAfterAnAllJoinedRound) {
  Net net(3);
  net.cache("a", 4, 0);
  net.submit(1, "a");  // pending on rank 1 only, then everyone joins
  for (int r = 0; r < 3; ++r) net[r].set_joined();
  EXPECT_FALSE(net[0].join_may_complete());
  net.run();
  EXPECT_TRUE(net[0].join_may_complete());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(net.executed(r), "a") << "rank " << r;  // before the join
}

TEST(CacheRoundsTest, ListsFromRankZeroRunAfterTheirRound) {
  Net net(2);
  net.cache("a", 4, 0);
  net.submit(0, "a");
  net.submit(1, "a");
  // Rank 0 started round 1 before the list, so the list is tagged 1; rank 1 gets the list before
  // it has completed round 1.
  ASSERT_TRUE(net[0].round_due());
  net.pump(0);
  ResponseList list;
  list.round = net[0].tag();
  EXPECT_EQ(list.round, 1u);
  Response r;
  r.names = {"coordinated"};
  list.responses = {r};
  net.hold(1, list);
  net.hold(0, list);
  EXPECT_TRUE(net.steps(1).empty());  // waits for round 1
  net.run();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(net.steps(rank).size(), 2u);
    EXPECT_TRUE(net.steps(rank)[0].round);
    EXPECT_TRUE(net.steps(rank)[1].responses);
  }
  ResponseList late;
  late.round = net[0].tag();
  net.hold(1, late);  // tagged with a completed round: runs at once
  EXPECT_EQ(net.steps(1).size(), 3u);
}

TEST(CacheRoundsTest, InvalidationRequeuesPendingAndErasesEverywhere) {
  Net net(3);
  net.cache("w", 4, 7);
  net.submit(0, "w");
  net.submit(2, "w");
  // Rank 1 re-submits "w" with another shape: full request to rank 0 plus an announcement.
  auto d = net[1].route(allreduce("w", 5));
  EXPECT_EQ(d.route, CacheRounds::Route::kFull);
  EXPECT_TRUE(d.invalidate);
  EXPECT_EQ(d.id, 7);
  net[1].announce_invalidation(d.id, d.version);
  net.run();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(net.executed(r), "") << "rank " << r;
    EXPECT_EQ(net[r].route(allreduce("w", 4)).route, CacheRounds::Route::kFull) << "rank " << r;
    EXPECT_EQ(net[r].pending_count(), 0u);
  }
  for (int r : {0, 2}) {
    ASSERT_EQ(net.steps(r).size(), 1u);
    EXPECT_EQ(net.steps(r)[0].round->requeue, std::vector<std::string>{"w"});
  }
  EXPECT_TRUE(net.steps(1)[0].round->requeue.empty());
}

TEST(CacheRoundsTest, AnnouncementOfAnOlderVersionKeepsTheReLearnedEntry) {
  // Every rank re-submitted "w" with a new shape; rank 0 re-cached it under the same id before the
  // round carrying the announcements completed. The new entry must survive.
  Net net(2);
  net.cache("w", 4, 3);
  auto d = net[0].route(allreduce("w", 6));
  ASSERT_TRUE(d.invalidate);
  net[0].announce_invalidation(d.id, d.version);
  net.cache("w", 6, 3);  // the renegotiated response, executed before the round completes
  net.run();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(net[r].route(allreduce("w", 6)).route, CacheRounds::Route::kRound);
}

TEST(CacheRoundsTest, RoutesNonAllreduceAndGroupsToRankZero) {
  CacheRoundsOptions o;
  o.size = 2;
  CacheRounds c(o);
  Request b = allreduce("b", 3);
  b.type = OpType::kBroadcast;
  b.root = 1;
  c.learn(0, b, response_for(b, 0), 0);
  EXPECT_EQ(c.route(b).route, CacheRounds::Route::kBrief);
  Request g = allreduce("g", 3);
  g.group = "grp";
  g.group_size = 2;
  c.learn(1, g, response_for(g, 1), 0);
  EXPECT_EQ(c.route(g).route, CacheRounds::Route::kBrief);
  EXPECT_EQ(c.route(allreduce("new", 3)).route, CacheRounds::Route::kFull);
  b.root = 0;  // other metadata, not round-eligible: no announcement needed
  EXPECT_FALSE(c.route(b).invalidate);
  o.enabled = false;
  CacheRounds off(o);
  Request a = allreduce("a", 3);
  off.learn(0, a, response_for(a, 0), 0);
  EXPECT_EQ(off.route(a).route, CacheRounds::Route::kBrief);
  EXPECT_FALSE(off.round_due());
}

TEST(CacheRoundsTest, OutOfSequenceOrDuplicateVectorsAreProtocolErrors) {
  CacheRoundsOptions o;
  o.size = 3;
  CacheRounds c(o);
  RoundMessage m;
  m.round = 2;  // this rank has not even started round 1
  EXPECT_THROW(c.receive(1, m), ProtocolError);
  m.round = 1;
  c.receive(1, m);
  EXPECT_THROW(c.receive(1, m), ProtocolError);
  EXPECT_THROW(c.receive(0, m), ProtocolError);  // itself
  EXPECT_TRUE(c.round_due());                    // must answer round 1
  c.start_round(Clock::now(), {});
  m.round = 2;
  c.receive(1, m);  // a peer that completed round 1 already may be one ahead
  EXPECT_FALSE(c.next());
  m.round = 1;
  c.receive(2, m);
  auto s = c.next();
  ASSERT_TRUE(s && s->round);
  EXPECT_EQ(s->round->round, 1u);
  EXPECT_TRUE(c.round_due());  // round 2 arrived from rank 1: answer it
}

TEST(CacheRoundsTest, UnknownReadyIdIsAProtocolError) {
  CacheRoundsOptions o;
  o.size = 2;
  CacheRounds c(o);
  c.set_joined();  // joined: ready for anything a peer has pending
  c.start_round(Clock::now(), {});
  RoundMessage m;
  m.round = 1;
  m.pending = {5};  // never issued as far as this rank knows
  c.receive(1, m);
  EXPECT_THROW(c.next(), ProtocolError);
}

TEST(CacheRoundsTest, StallsNameTheRanksThatLackedTheTensor) {
  Net net(3);
  net.cache("slow", 4, 0);
  net.submit(0, "slow");
  net.submit(2, "slow");
  net.run();
  auto later = Clock::now() + std::chrono::seconds(5);
  auto stalls = net[0].check_stalls(later, 1.0);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].name, "slow");
  EXPECT_EQ(stalls[0].missing_ranks, std::vector<int>{1});
  EXPECT_TRUE(net[0].check_stalls(later, 1.0).empty());  // warned once
  EXPECT_TRUE(net[0].late_ranks(later, 1.0).empty());    // no round in progress
}

TEST(CacheRoundsTest, LateRanksOfARoundInProgress) {
  CacheRoundsOptions o;
  o.size = 3;
  CacheRounds c(o);
  auto t0 = Clock::now();
  c.add_pending(0, t0);
  c.start_round(t0, {});
  RoundMessage m;
  m.round = 1;
  c.receive(2, m);
  EXPECT_TRUE(c.late_ranks(t0 + std::chrono::milliseconds(100), 1.0).empty());
  EXPECT_EQ(c.late_ranks(t0 + std::chrono::seconds(2), 1.0), std::vector<int>{1});
  ASSERT_TRUE(c.next_wakeup(1.0, 0));
  EXPECT_LE(*c.next_wakeup(1.0, 0), t0 + std::chrono::seconds(1));
}

}  // namespace
}  // namespace nezha::engine
