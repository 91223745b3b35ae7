// ControlChannel: in-order, exactly-once delivery across path switches (two ranks as threads).
#include "engine/negotiation/control_channel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/tcp_mesh.h"

namespace nezha::engine {
namespace {

using transport::testing::run_ranks;

class Pair {
 public:
  explicit Pair(int paths) {
    std::vector<ControlPathConfig> cfg;
    for (int i = 0; i < paths; ++i) cfg.push_back({std::string(1, 'a' + i), "127.0.0.1"});
    for (int r = 0; r < 2; ++r) ch_.push_back(std::make_unique<ControlChannel>(cfg, "s", r, 2, 1 << 20));
    std::vector<std::vector<std::string>> addrs(paths);
    for (int i = 0; i < paths; ++i)
      for (int r = 0; r < 2; ++r) addrs[i].push_back(ch_[r]->listen_addresses()[i]);
    run_ranks(2, [&](int r) { ch_[r]->connect_all(addrs, Deadline::after_seconds(10)); });
  }
  ControlChannel& operator[](int r) { return *ch_[r]; }

  // Receives exactly `n` messages on rank r (3 s each at most).
  std::vector<std::string> receive(int r, int n) {
    std::vector<std::string> got;
    while (static_cast<int>(got.size()) < n) {
      auto m = ch_[r]->recv_any(-1, Deadline::after_seconds(3));
      if (!m) break;
      EXPECT_EQ(m->peer, 1 - r);
      got.push_back(m->payload);
    }
    return got;
  }
  bool quiet(int r) { return !ch_[r]->recv_any(-1, Deadline::after_seconds(0.2)); }

 private:
  std::vector<std::unique_ptr<ControlChannel>> ch_;
};

// Peer connections in the channel's epoll set (its watch fd's entries, less each path's abort fd).
int count_watched(const ControlChannel& ch, int paths) {
  std::ifstream info("/proc/self/fdinfo/" + std::to_string(ch.watch_fd()));
  std::string line;
  int entries = 0;
  while (std::getline(info, line)) entries += line.rfind("tfd:", 0) == 0;
  return entries - paths;
}

std::vector<std::string> numbered(int from, int to) {
  std::vector<std::string> v;
  for (int i = from; i < to; ++i) v.push_back("m" + std::to_string(i));
  return v;
}

TEST(ControlChannel, SwitchingPathResendsUnacknowledgedAndReceiverDropsDuplicates) {
  Pair p(2);
  for (const auto& m : numbered(0, 5)) p[0].send(1, m);
  p[0].switch_path(1, "test");  // all five again, on path b
  EXPECT_EQ(p[0].path_of(1), 1);
  for (const auto& m : numbered(5, 8)) p[0].send(1, m);
  EXPECT_EQ(p.receive(1, 8), numbered(0, 8));
  EXPECT_TRUE(p.quiet(1));  // the duplicates were dropped, not delivered
}

TEST(ControlChannel, AcknowledgedMessagesAreNotSentAgain) {
  Pair p(2);
  for (const auto& m : numbered(0, 3)) p[0].send(1, m);
  EXPECT_EQ(p.receive(1, 3), numbered(0, 3));
  p[1].send(0, "ack carrier");  // carries "3 received"
  EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"ack carrier"});
  p[0].switch_path(1, "test");
  p[0].send(1, "m3");
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"m3"});
  EXPECT_TRUE(p.quiet(1));
}

TEST(ControlChannel, AvoidedPathMovesPeersAndFailedPathIsSurvived) {
  Pair p(3);
  p[0].avoid_path(0, true);
  EXPECT_EQ(p[0].path_of(1), 1);
  p[0].send(1, "x");
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"x"});
  // Path b dies on the receiver: the sender's next messages still arrive (via c), in order.
  p[1].testing_abort_path(1, "cable cut");
  p[0].send(1, "y");
  p[0].send(1, "z");
  auto got = p.receive(1, 2);
  if (got.size() < 2) {  // the sender has not noticed yet: it switches after silence
    p[0].switch_path(1, "silence");
    auto more = p.receive(1, 2 - static_cast<int>(got.size()));
    got.insert(got.end(), more.begin(), more.end());
  }
  EXPECT_EQ(got, (std::vector<std::string>{"y", "z"}));
}

TEST(ControlChannel, QuietPeerAcknowledgesSoNothingMoves) {
  Pair p(2);
  p[0].send(1, "x");
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"x"});
  EXPECT_TRUE(p.quiet(1));  // rank 1 has nothing to say: it acknowledges "x" on its own
  // Well past the ack timeout, and rank 0 has not looked since: it reads the acknowledgement
  // waiting in its socket before its timers judge "x" lost.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(p.quiet(0));
  EXPECT_EQ(p[0].path_of(1), 0);
}

TEST(ControlChannel, MessagesLostUnderACutGoAroundItWithinASecond) {
  // A pulled cable under path a on both sides: no error anywhere, everything on it is lost. A
  // request and its reply must still get through (each side's ack timeout moves it to path b),
  // with nobody else talking: the rail watchdog has nothing to watch while ranks wait for this.
  Pair p(2);
  p[0].testing_black_hole(0);
  p[1].testing_black_hole(0);
  auto start = Clock::now();
  double reply_after_s = -1;
  run_ranks(2, [&](int r) {
    if (r == 1) {
      p[1].send(0, "request");
      auto got = p.receive(1, 1);
      reply_after_s = std::chrono::duration<double>(Clock::now() - start).count();
      EXPECT_EQ(got, std::vector<std::string>{"reply"});
      EXPECT_TRUE(p.quiet(1));  // acknowledges the reply
    } else {
      EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"request"});
      p[0].send(1, "reply");
      for (int i = 0; i < 8; ++i) p.quiet(0);  // rank 0 waits, as an engine does: timers run
    }
  });
  EXPECT_GT(reply_after_s, 0);
  EXPECT_LT(reply_after_s, 2.0);  // about 2 x 100 ms; 2.5 s is the engine's silence switch
  EXPECT_EQ(p[0].path_of(1), 1);
  EXPECT_EQ(p[1].path_of(0), 1);
}

TEST(ControlChannel, AMessageOnAPathWhoseLinkIsGoneMovesAtOnceNotAfterTheAckTimeout) {
  // Rank 1's cable to rail a is pulled: a loses what rank 1 sends, and its interface has no
  // carrier. The first run of rank 1's timers after the send moves the message to b, long before
  // the 100 ms ack timeout (a pulled cable under the control path used to cost that much more).
  Pair p(2);
  p[1].testing_black_hole(0);
  p[1].testing_link_fault(0, "interface rail0 has no carrier");
  p[1].send(0, "request");
  EXPECT_FALSE(p[1].recv_any(-1, Deadline::after_seconds(0)));  // runs the timers once, waits not
  EXPECT_EQ(p[1].path_of(0), 1);
  run_ranks(2, [&](int r) {
    if (r == 0) {
      EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"request"});
      for (int i = 0; i < 3; ++i) p.quiet(0);  // acknowledges it on b
    } else {
      for (int i = 0; i < 3; ++i) p.quiet(1);
    }
  });
  EXPECT_EQ(p[1].path_of(0), 1);
  EXPECT_EQ(p[0].path_of(1), 1);  // rank 0 followed rank 1's move
}

TEST(ControlChannel, ALinkFaultOnEveryPathIsLeftToTheAckTimeouts) {
  // Both of rank 1's links report a fault (its next path is no better): no move on the carrier
  // alone, so no resend every 10 ms; the ack timeout handles it.
  Pair p(2);
  p[1].testing_link_fault(0, "no carrier");
  p[1].testing_link_fault(1, "no carrier");
  p[1].send(0, "request");
  EXPECT_FALSE(p[1].recv_any(-1, Deadline::after_seconds(0)));
  EXPECT_EQ(p[1].path_of(0), 0);
  EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"request"});  // a still delivers here
}

TEST(ControlChannel, AckTimeoutsTryAvoidedPathsWhenThePreferredOneIsCut) {
  // Rail a was marked down by mistake (avoided), rail b is really cut: a still works and must be
  // used, or no rank could tell rank 0 anything until the job timed out.
  Pair p(2);
  for (int r = 0; r < 2; ++r) {
    p[r].avoid_path(0, true);
    p[r].testing_black_hole(1);
  }
  run_ranks(2, [&](int r) {
    if (r == 1) {
      p[1].send(0, "request");
      for (int i = 0; i < 5; ++i) p.quiet(1);  // waits, as an engine does: its timers run
    } else {
      EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"request"});
      for (int i = 0; i < 5; ++i) p.quiet(0);  // acknowledges it, on the path it came by
    }
  });
  EXPECT_EQ(p[1].path_of(0), 0);  // acknowledged there: it stays
}

TEST(ControlChannel, AMessageStillInFlightOnTheOldPathDoesNotPullThePairBack) {
  // Rank 0 moves to path b; rank 1 sent "stale" on a before it heard of the move. "stale" arriving
  // on a must not take rank 0 back to a (and rank 1 after it); rank 1 follows rank 0 to b.
  Pair p(2);
  p[0].switch_path(1, "test");
  p[1].send(0, "stale");  // rank 1 still on a
  p[0].send(1, "moved");  // on b, with the newer move
  EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"stale"});
  EXPECT_EQ(p[0].path_of(1), 1);
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"moved"});
  EXPECT_EQ(p[1].path_of(0), 1);
  run_ranks(2, [&](int r) {  // acknowledgements go both ways
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(p.quiet(r));
  });
  EXPECT_EQ(p[0].path_of(1), 1);
  EXPECT_EQ(p[1].path_of(0), 1);
}

TEST(ControlChannel, TwoRanksMovingAtOnceSettleOnOnePath) {
  // Rank 0 moves to c and rank 1 to b at the same time (each sees a different path fail): the
  // higher rank's move wins on both sides, and every message still arrives exactly once.
  Pair p(3);
  p[0].avoid_path(1, true);
  p[0].switch_path(1, "test");
  p[0].avoid_path(1, false);
  ASSERT_EQ(p[0].path_of(1), 2);
  p[1].switch_path(0, "test");
  ASSERT_EQ(p[1].path_of(0), 1);
  p[0].send(1, "from 0");
  p[1].send(0, "from 1");
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"from 0"});
  EXPECT_EQ(p.receive(0, 1), std::vector<std::string>{"from 1"});
  run_ranks(2, [&](int r) {  // resends and acknowledgements settle; nothing is delivered twice
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(p.quiet(r));
  });
  EXPECT_EQ(p[0].path_of(1), 1);
  EXPECT_EQ(p[1].path_of(0), 1);
  p[0].send(1, "after");
  EXPECT_EQ(p.receive(1, 1), std::vector<std::string>{"after"});
}

TEST(ControlChannel, LastWordsBeforeAPeerClosesAreDeliveredBeforeItsLoss) {
  // Rank 0's fatal error (naming a dead rank) is the last thing it sends before it closes: the
  // peer must read it, and only then learn that rank 0 is gone.
  Pair p(1);
  p[0].send(1, "last words");
  p[0].close();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // message and close both arrived
  auto m = p[1].recv_any(-1, Deadline::after_seconds(3));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->payload, "last words");
  EXPECT_THROW(p[1].recv_any(-1, Deadline::after_seconds(3)), PeerError);
}

TEST(ControlChannel, EveryPathFailingIsAPeerError) {
  Pair p(2);
  p[0].testing_abort_path(0, "gone");
  p[0].testing_abort_path(1, "gone too");
  EXPECT_THROW(p[0].send(1, "nowhere"), PeerError);
}

TEST(ControlChannel, AStarThroughRankZeroConnectsOnlyItsSpokes) {
  // Workers leave each other out (empty addresses): each holds one connection per path, to rank 0;
  // rank 0 holds n - 1. Messages go both ways on every spoke, also after a path fails on rank 0;
  // a worker sending to another worker is refused.
  const int n = 4, paths = 2;
  std::vector<ControlPathConfig> cfg{{"a", "127.0.0.1"}, {"b", "127.0.0.1"}};
  std::vector<std::unique_ptr<ControlChannel>> ch;
  for (int r = 0; r < n; ++r) ch.push_back(std::make_unique<ControlChannel>(cfg, "s", r, n, 1 << 20));
  run_ranks(n, [&](int r) {
    std::vector<std::vector<std::string>> addrs(paths);
    for (int i = 0; i < paths; ++i)
      for (int q = 0; q < n; ++q)
        addrs[i].push_back(r == 0 || q == 0 || q == r ? ch[q]->listen_addresses()[i] : "");
    ch[r]->connect_all(addrs, Deadline::after_seconds(10));
  });
  std::vector<std::string> got_by_zero;
  run_ranks(n, [&](int r) {
    if (r == 0) {
      for (int w = 1; w < n; ++w) ch[0]->send(w, "to " + std::to_string(w));
      while (got_by_zero.size() < static_cast<size_t>(n - 1)) {
        auto m = ch[0]->recv_any(-1, Deadline::after_seconds(3));
        ASSERT_TRUE(m);
        got_by_zero.push_back(m->payload);
      }
      return;
    }
    ch[r]->send(0, "from " + std::to_string(r));
    auto m = ch[r]->recv_any(-1, Deadline::after_seconds(3));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->peer, 0);
    EXPECT_EQ(m->payload, "to " + std::to_string(r));
    EXPECT_THROW(ch[r]->send(r % (n - 1) + 1, "sideways"), InvalidArgument);
  });
  std::sort(got_by_zero.begin(), got_by_zero.end());
  EXPECT_EQ(got_by_zero, (std::vector<std::string>{"from 1", "from 2", "from 3"}));
  // Every connection a rank holds is watched: rank 0 one per worker per path, a worker one per path.
  for (int r = 0; r < n; ++r) {
    (void)ch[r]->recv_any(-1, Deadline::after_seconds(0));
    EXPECT_EQ(count_watched(*ch[r], paths), r == 0 ? paths * (n - 1) : paths) << "rank " << r;
  }
  ch[0]->avoid_path(0, true);  // rank 0's spokes move to path b; the workers follow
  run_ranks(n, [&](int r) {
    if (r == 0) {
      for (int w = 1; w < n; ++w) ch[0]->send(w, "again");
      return;
    }
    auto m = ch[r]->recv_any(-1, Deadline::after_seconds(3));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->payload, "again");
  });
}

}  // namespace
}  // namespace nezha::engine
