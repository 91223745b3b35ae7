// ControlChannel with a shared-memory host path beside a TCP path (ranks as threads): the host path
// is preferred where it reaches, left alone where it does not, never left for a merely slow peer,
// and a peer's failure on it still moves the pair to the network.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/negotiation/control_channel.h"
#include "transport/rank_threads.h"

namespace nezha::engine {
namespace {

using transport::testing::run_ranks;

// n ranks, each with a TCP path "lo" (index 0) and a host path "shm" (index 1); host_of[r] is rank
// r's host entry.
std::vector<std::unique_ptr<ControlChannel>> connect_channels(const std::vector<std::string>& host_of) {
  const int n = static_cast<int>(host_of.size());
  std::vector<std::unique_ptr<ControlChannel>> ch;
  for (int r = 0; r < n; ++r) {
    std::vector<ControlPathConfig> cfg{{"lo", "127.0.0.1", "tcp", ""}, {"shm", "", "shm", host_of[r]}};
    ch.push_back(std::make_unique<ControlChannel>(cfg, "host-path-test", r, n, 1 << 20));
  }
  std::vector<std::vector<std::string>> addrs(2);
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < n; ++r) addrs[i].push_back(ch[r]->listen_addresses()[i]);
  run_ranks(n, [&](int r) { ch[r]->connect_all(addrs, Deadline::after_seconds(10)); });
  return ch;
}

std::string receive_from(ControlChannel& ch, int peer, double timeout_s = 3) {
  auto m = ch.recv_any(-1, Deadline::after_seconds(timeout_s));
  if (!m) return "(nothing)";
  EXPECT_EQ(m->peer, peer);
  return m->payload;
}

TEST(ControlChannelHostPath, RanksOfOneHostTalkThroughSharedMemory) {
  auto ch = connect_channels({"a", "a"});
  EXPECT_EQ(ch[0]->path_of(1), 1);
  EXPECT_EQ(ch[0]->path_name_of(1), "control/shm");
  EXPECT_EQ(ch[1]->path_of(0), 1);
  EXPECT_FALSE(ch[1]->readable_now());
  ch[0]->send(1, "over shared memory");
  EXPECT_TRUE(ch[1]->readable_now());  // seen in the rings, before any wait
  EXPECT_EQ(receive_from(*ch[1], 0), "over shared memory");
  ch[1]->send(0, "and back");
  EXPECT_EQ(receive_from(*ch[0], 1), "and back");
}

TEST(ControlChannelHostPath, APeerOnAnotherHostIsReachedOverTheNetworkPath) {
  auto ch = connect_channels({"a", "a", "b"});
  EXPECT_EQ(ch[0]->path_of(1), 1);
  EXPECT_EQ(ch[0]->path_of(2), 0);
  EXPECT_EQ(ch[2]->path_of(0), 0);
  ch[2]->send(0, "from host b");
  ch[1]->send(0, "from host a");
  std::vector<std::string> got;
  for (int i = 0; i < 2; ++i) {
    auto m = ch[0]->recv_any(-1, Deadline::after_seconds(3));
    ASSERT_TRUE(m);
    got.push_back(std::to_string(m->peer) + ":" + m->payload);
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"1:from host a", "2:from host b"}));
}

TEST(ControlChannelHostPath, ASlowPeerIsNotMovedOffTheHostPath) {
  auto ch = connect_channels({"a", "a"});
  ch[0]->send(1, "unanswered for a while");
  // Rank 1 reads nothing for several ack timeouts (100 ms and doubling on a network path) while
  // rank 0 runs its timers.
  const auto until = Clock::now() + std::chrono::milliseconds(600);
  while (Clock::now() < until) EXPECT_FALSE(ch[0]->recv_any(-1, Deadline::after_seconds(0.05)));
  EXPECT_EQ(ch[0]->path_of(1), 1);
  EXPECT_EQ(receive_from(*ch[1], 0), "unanswered for a while");
  EXPECT_EQ(ch[1]->path_of(0), 1);
}

// Runs `ch`'s timers (recv_any returns nothing) until `done` or `limit`; the seconds it took.
template <typename Done>
double run_timers_until(ControlChannel& ch, Done done, double limit_s) {
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  while (!done() && elapsed() < limit_s) EXPECT_FALSE(ch.recv_any(-1, Deadline::after_seconds(0.02)));
  return elapsed();
}

TEST(ControlChannelHostPath, AnAcknowledgementOnTheHostPathWaitsForAMessageToCarryIt) {
  auto ch = connect_channels({"a", "a"});
  ch[0]->send(1, "request");
  EXPECT_EQ(receive_from(*ch[1], 0), "request");
  const uint64_t before = ch[1]->sent_on_reliable_paths();
  // Nothing is resent from a reliable path, so no bare acknowledgement within a network path's
  // delay (10 ms): the next message carries it.
  run_timers_until(*ch[1], [] { return false; }, 0.2);
  EXPECT_EQ(ch[1]->sent_on_reliable_paths(), before);
  ch[1]->send(0, "response");  // carries the acknowledgement
  EXPECT_EQ(receive_from(*ch[0], 1), "response");
  EXPECT_EQ(ch[1]->sent_on_reliable_paths(), before + 1);
  // Left owing one (rank 0 sends nothing more), a rank still acknowledges, after about a second.
  const uint64_t owed = ch[0]->sent_on_reliable_paths();
  const double took = run_timers_until(*ch[0], [&] { return ch[0]->sent_on_reliable_paths() > owed; }, 5);
  EXPECT_EQ(ch[0]->sent_on_reliable_paths(), owed + 1);
  EXPECT_GE(took, 0.5);
}

TEST(ControlChannelHostPath, AnAcknowledgementOnTheNetworkPathGoesOutAtOnce) {
  auto ch = connect_channels({"a", "b"});  // two hosts: the TCP path, where a lost ack means a resend
  ch[0]->send(1, "request");
  EXPECT_EQ(receive_from(*ch[1], 0), "request");
  const uint64_t before = ch[1]->sent_on_other_paths();
  const double took = run_timers_until(*ch[1], [&] { return ch[1]->sent_on_other_paths() > before; }, 5);
  EXPECT_EQ(ch[1]->sent_on_other_paths(), before + 1);
  EXPECT_LT(took, 0.5);  // 10 ms, and a loaded machine's scheduling
}

TEST(ControlChannelHostPath, AFailedHostPathMovesThePairToTheNetworkWithNothingLost) {
  auto ch = connect_channels({"a", "a"});
  ch[0]->send(1, "m0");
  EXPECT_EQ(receive_from(*ch[1], 0), "m0");
  ch[0]->testing_abort_path(1, "test: the shm path fails on rank 0");
  ch[0]->send(1, "m1");  // fails on shm, goes on lo
  EXPECT_EQ(ch[0]->path_of(1), 0);
  EXPECT_EQ(receive_from(*ch[1], 0), "m1");
  ch[1]->send(0, "reply");  // rank 1 followed rank 0 onto lo
  EXPECT_EQ(ch[1]->path_of(0), 0);
  EXPECT_EQ(receive_from(*ch[0], 1), "reply");
}

}  // namespace
}  // namespace nezha::engine
