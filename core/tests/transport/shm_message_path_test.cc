// The shared-memory control path: whole messages in order per peer through small rings, the doorbell
// protocol (a sleeping receiver is woken; one that polls readable_now() sees messages without one; a
// read wakes the sender only when it is blocked on a full ring; a rank awaiting several messages is
// woken by the last), failures (a closed or exited peer named after its last words, abort, a full
// ring at the deadline) and the same-host rule.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <thread>

#include "common/error.h"
#include "rank_threads.h"
#include "shm_process_job.h"
#include "transport/shm/shm_message_path.h"

namespace nezha::transport {
namespace {

using testing::run_ranks;

ShmMessagePathConfig small_rings(const std::string& host_id = "") {
  ShmMessagePathConfig c;
  c.name = "control/shm-test";
  c.secret = "shm-control-test-secret";
  c.host_id = host_id;
  c.max_ring_bytes = ShmMessagePath::kMinRingBytes;  // messages larger than the ring stream through
  c.liveness_slice_ms = 20;
  return c;
}

std::vector<std::unique_ptr<ShmMessagePath>> make_paths(int n, ShmMessagePathConfig c = small_rings()) {
  std::vector<std::unique_ptr<ShmMessagePath>> paths;
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) {
    paths.push_back(std::make_unique<ShmMessagePath>(c, r, n));
    addrs.push_back(paths.back()->local_address());
  }
  const Deadline deadline = Deadline::after_seconds(10);
  run_ranks(n, [&](int r) { paths[r]->connect(addrs, deadline); });
  return paths;
}

std::string message_text(int sender, int i, size_t bytes) {
  std::string s(bytes, '\0');
  for (size_t k = 0; k < bytes; ++k) s[k] = static_cast<char>('a' + (sender * 7 + i * 3 + k) % 26);
  return s;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One wait of the control channel's kind: arm, poll, read what the poll found into out (what came
// before a failure too).
void poll_then_read(MessagePath& path, int timeout_ms, std::vector<MessagePath::Message>& out) {
  std::vector<pollfd> fds;
  path.append_poll_fds(fds);
  ::poll(fds.data(), fds.size(), timeout_ms);
  path.read_polled(fds.data(), fds.size(), out);
}
std::vector<MessagePath::Message> poll_then_read(MessagePath& path, int timeout_ms) {
  std::vector<MessagePath::Message> out;
  poll_then_read(path, timeout_ms, out);
  return out;
}

TEST(ShmControl, MessagesFromManyPeersArriveWholeAndInOrderPerPeer) {
  const int n = 4;
  auto paths = make_paths(n);
  ASSERT_EQ(paths[0]->ring_bytes(), ShmMessagePath::kMinRingBytes);
  // Empty messages, ones that straddle the ring's end, and ones many times the ring's size.
  const std::vector<size_t> sizes = {0, 1, 17, 4096, 100000, 0, 16384, 3, 1 << 20};
  run_ranks(n, [&](int me) {
    if (me != 0) {
      for (size_t i = 0; i < sizes.size(); ++i)
        paths[me]->send_message(0, message_text(me, static_cast<int>(i), sizes[i]), Deadline::after_seconds(10));
      return;
    }
    std::map<int, int> next;
    for (size_t got = 0; got < (n - 1) * sizes.size(); ++got) {
      auto msg = paths[0]->recv_message_any(-1, Deadline::after_seconds(10));
      ASSERT_TRUE(msg.has_value()) << "timed out after " << got << " messages";
      const int i = next[msg->peer]++;
      ASSERT_EQ(msg->payload, message_text(msg->peer, i, sizes[i])) << "from rank " << msg->peer << " #" << i;
    }
    for (int p = 1; p < n; ++p) EXPECT_EQ(next[p], static_cast<int>(sizes.size())) << "rank " << p;
  });
}

TEST(ShmControl, TwoRanksSendingEachOtherMoreThanTheirRingsNeverDeadlock) {
  auto paths = make_paths(2);
  const int count = 8;
  const size_t bytes = 200000;  // twelve rings' worth each
  run_ranks(2, [&](int me) {
    const int peer = 1 - me;
    for (int i = 0; i < count; ++i)
      paths[me]->send_message(peer, message_text(me, i, bytes), Deadline::after_seconds(20));
    for (int i = 0; i < count; ++i) {
      auto msg = paths[me]->recv_message_any(-1, Deadline::after_seconds(20));
      ASSERT_TRUE(msg.has_value()) << "rank " << me << " #" << i;
      EXPECT_EQ(msg->peer, peer);
      ASSERT_EQ(msg->payload, message_text(peer, i, bytes)) << "rank " << me << " #" << i;
    }
  });
}

TEST(ShmControl, ASleepingReceiverIsWokenAndAPollingOneSeesTheMessageWithoutAWait) {
  auto paths = make_paths(2);
  // Asleep in poll on its doorbell: the send wakes it long before the 10 s timeout.
  auto waiting = std::async(std::launch::async, [&] {
    const auto start = Clock::now();
    auto got = poll_then_read(*paths[0], 10000);
    return std::make_pair(got, seconds_since(start));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  paths[1]->send_message(0, "wake up", Deadline::after_seconds(5));
  auto [got, waited] = waiting.get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "wake up");
  EXPECT_LT(waited, 5.0);
  // Awake (nothing armed since the last read): the sender makes no system call for it, and the
  // receiver sees the message by looking at its rings.
  EXPECT_FALSE(paths[0]->readable_now());
  paths[1]->send_message(0, "seen", Deadline::after_seconds(5));
  EXPECT_TRUE(paths[0]->readable_now());
  // Arming finds it there and rings its own doorbell, so the next poll does not sleep on it.
  const auto start = Clock::now();
  got = poll_then_read(*paths[0], 10000);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "seen");
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_FALSE(paths[0]->readable_now());
}

TEST(ShmControl, ReadingAMessageWakesItsSenderOnlyWhenTheSenderWaitsForSpace) {
  // Lock-step: the sender of a request sleeps waiting for the answer, not for ring space, so the
  // receiver taking the request in must not ring it (a wake-up for nothing per message).
  auto paths = make_paths(2);
  paths[1]->send_message(0, "request", Deadline::after_seconds(5));
  std::vector<pollfd> asleep;
  paths[1]->append_poll_fds(asleep);  // armed, as before a wait for the answer
  auto got = poll_then_read(*paths[0], 5000);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "request");
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 50), 0) << "the request's sender was woken by its reading";
  paths[0]->send_message(1, "answer", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 5000), 1) << "the answer did not wake its receiver";
  std::vector<MessagePath::Message> answer;
  paths[1]->read_polled(asleep.data(), asleep.size(), answer);
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_EQ(answer[0].payload, "answer");
}

TEST(ShmControl, ASenderBlockedOnAFullRingIsWokenByTheRead) {
  // A blocked sender unwoken re-checks only when its wait runs out (the liveness slice, at most a
  // second); this message fills the ring three times, so without the wake it takes two seconds or
  // more, and with it milliseconds.
  ShmMessagePathConfig c = small_rings();
  c.liveness_slice_ms = 20000;
  auto paths = make_paths(2, c);
  const std::string big = message_text(1, 0, 3 * ShmMessagePath::kMinRingBytes);
  auto sending = std::async(std::launch::async, [&] {
    const auto start = Clock::now();
    paths[1]->send_message(0, big, Deadline::after_seconds(30));
    return seconds_since(start);
  });
  std::vector<MessagePath::Message> got;
  const auto start = Clock::now();
  while (got.empty() && seconds_since(start) < 10) poll_then_read(*paths[0], 1000, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, big);
  EXPECT_LT(sending.get(), 0.9) << "the blocked sender was not woken by the reads";
}

TEST(ShmControl, ARankAwaitingSeveralMessagesIsWokenByTheLast) {
  auto paths = make_paths(4);
  paths[0]->wake_after_messages(3);
  std::vector<pollfd> asleep;
  paths[0]->append_poll_fds(asleep);
  paths[1]->send_message(0, "one", Deadline::after_seconds(5));
  paths[2]->send_message(0, "two", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 50), 0) << "woken before the third message";
  paths[3]->send_message(0, "three", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 5000), 1) << "the third message did not wake it";
  std::vector<MessagePath::Message> got;
  paths[0]->read_polled(asleep.data(), asleep.size(), got);
  EXPECT_EQ(got.size(), 3u);
  // Set back to one: each message wakes it again.
  paths[0]->wake_after_messages(1);
  asleep.clear();
  paths[0]->append_poll_fds(asleep);
  paths[2]->send_message(0, "again", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 5000), 1) << "a single message did not wake it";
}

TEST(ShmControl, SettingTheCountBackToOneAnnouncesMessagesThatCameUnrung) {
  // A wait armed with a count may end before it is reached (a bounded lead), and whoever waits
  // next without arming again (a thread asleep since before) must still be woken for them.
  auto paths = make_paths(3);
  paths[0]->wake_after_messages(2);
  std::vector<pollfd> asleep;
  paths[0]->append_poll_fds(asleep);
  paths[1]->send_message(0, "unrung", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 50), 0) << "rung before the count";
  paths[0]->wake_after_messages(1);
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 0), 1) << "the message that came is not announced";
  std::vector<MessagePath::Message> got;
  paths[0]->read_polled(asleep.data(), asleep.size(), got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "unrung");
  // Still armed (not read since) when set back to one: the next message rings at once.
  asleep.clear();
  paths[0]->wake_after_messages(2);
  paths[0]->append_poll_fds(asleep);
  paths[0]->wake_after_messages(1);
  paths[2]->send_message(0, "after", Deadline::after_seconds(5));
  ASSERT_EQ(::poll(asleep.data(), asleep.size(), 5000), 1) << "a message after the reset did not ring";
}

TEST(ShmControl, AwaitingSeveralMessagesNeverSleepsOnOnesAlreadyInOrOnAClosedPeer) {
  auto paths = make_paths(3);
  // Sent before the wait is armed: arming finds it and rings at once, whatever the count.
  paths[1]->send_message(0, "early", Deadline::after_seconds(5));
  paths[0]->wake_after_messages(2);
  auto got = poll_then_read(*paths[0], 5000);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "early");
  // A peer that closes its path ends the wait at once, named, though the count is not reached.
  const auto start = Clock::now();
  auto waiting = std::async(std::launch::async, [&]() -> std::string {
    try {
      poll_then_read(*paths[0], 10000);
      return "no error";
    } catch (const PeerError& e) {
      return e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  paths[2]->close();
  const std::string error = waiting.get();
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_NE(error.find("rank 2"), std::string::npos) << error;
}

TEST(ShmControl, WakeFdEndsTheWaitWithoutBeingConsumed) {
  auto paths = make_paths(2);
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const uint64_t one = 1;
  ASSERT_EQ(::write(wake, &one, sizeof one), 8);
  EXPECT_FALSE(paths[0]->recv_message_any(wake, Deadline::after_seconds(10)).has_value());
  uint64_t v = 0;
  EXPECT_EQ(::read(wake, &v, sizeof v), 8);
  const auto start = Clock::now();
  EXPECT_FALSE(paths[0]->recv_message_any(wake, Deadline::after_seconds(0.2)).has_value());
  EXPECT_LT(seconds_since(start), 5.0);
  ::close(wake);
}

TEST(ShmControl, AClosedPeerIsAPeerErrorAfterItsLastWordsAndTheOthersGoOn) {
  auto paths = make_paths(3);
  paths[2]->send_message(0, "last words", Deadline::after_seconds(5));
  paths[2]->close();
  std::vector<std::string> got;
  const auto start = Clock::now();
  for (;;) {
    ASSERT_LT(seconds_since(start), 10.0) << "the closed peer was never reported";
    std::vector<MessagePath::Message> out;
    try {
      poll_then_read(*paths[0], 100, out);
      for (auto& m : out) got.push_back(m.payload);
    } catch (const PeerError& e) {
      for (auto& m : out) got.push_back(m.payload);
      EXPECT_EQ(e.peer(), 2);
      EXPECT_NE(std::string(e.what()).find("rank 2 closed its control path"), std::string::npos) << e.what();
      break;
    }
  }
  EXPECT_EQ(got, std::vector<std::string>{"last words"});
  EXPECT_FALSE(paths[0]->reaches(2));
  EXPECT_THROW(paths[0]->send_message(2, "x", Deadline::after_seconds(1)), PeerError);
  paths[1]->send_message(0, "still here", Deadline::after_seconds(5));
  auto msg = paths[0]->recv_message_any(-1, Deadline::after_seconds(5));
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->peer, 1);
  EXPECT_EQ(msg->payload, "still here");
}

TEST(ShmControl, AbortWakesTheWaitAndNamesTheReason) {
  auto paths = make_paths(2);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      paths[0]->recv_message_any(-1, Deadline::after_seconds(30));
      return std::string("returned");
    } catch (const NezhaError& e) {
      return std::string(e.what());
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  paths[0]->abort("stop");
  EXPECT_EQ(waiting.get(), "control/shm-test aborted: stop");
  // The peer sees this rank's path closed.
  EXPECT_THROW(paths[1]->recv_message_any(-1, Deadline::after_seconds(5)), PeerError);
}

TEST(ShmControl, AFullRingAtTheDeadlineIsATimeoutNamingThePeer) {
  auto paths = make_paths(2);
  const auto start = Clock::now();
  try {
    paths[0]->send_message(1, std::string(1 << 20, 'x'), Deadline::after_seconds(0.3));
    FAIL() << "a peer that never reads took 1 MiB through a 16 KiB ring";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("rank 1 stopped reading"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(ShmControl, RanksOnAnotherHostAreLeftToOtherPaths) {
  // Ranks 0 and 1 on host "a", rank 2 on host "b": only 0-1 are linked.
  std::vector<std::unique_ptr<ShmMessagePath>> paths;
  std::vector<std::string> addrs;
  for (int r = 0; r < 3; ++r) {
    paths.push_back(std::make_unique<ShmMessagePath>(small_rings(r < 2 ? "a" : "b"), r, 3));
    addrs.push_back(paths.back()->local_address());
  }
  run_ranks(3, [&](int r) { paths[r]->connect(addrs, Deadline::after_seconds(10)); });
  EXPECT_TRUE(paths[0]->reaches(1));
  EXPECT_FALSE(paths[0]->reaches(2));
  EXPECT_FALSE(paths[2]->reaches(0));
  EXPECT_THROW(paths[2]->send_message(0, "x", Deadline::after_seconds(1)), InvalidArgument);
  // An empty address leaves a rank out too (the control channel's star).
  addrs[1].clear();
  auto p0 = std::make_unique<ShmMessagePath>(small_rings("a"), 0, 3);
  addrs[0] = p0->local_address();
  p0->connect(addrs, Deadline::after_seconds(5));
  EXPECT_FALSE(p0->reaches(1));
}

using ControlJob = testing::BasicProcessJob<ShmMessagePath, ShmMessagePathConfig>;

TEST(ShmControlProcesses, AKilledRankIsNamedAtOnceAfterItsLastMessages) {
  ControlJob job(
      2,
      [](ShmMessagePath& path) -> std::string {
        // Rank 1 sends, then dies without closing anything; rank 0 names it.
        if (path.reaches(0)) {
          path.send_message(0, "before dying", Deadline::after_seconds(5));
          ::kill(::getpid(), SIGKILL);
        }
        std::string seen;
        const auto start = Clock::now();
        std::vector<MessagePath::Message> out;
        try {
          for (;;) {
            if (seconds_since(start) > 10) return seen + "|never reported";
            out.clear();
            poll_then_read(path, 100, out);
            for (auto& m : out) seen += m.payload;
          }
        } catch (const PeerError& e) {
          for (auto& m : out) seen += m.payload;
          const std::string what = e.what();
          return seen + "|" + std::to_string(e.peer()) + (what.find("exited") != std::string::npos ? " exited" : what);
        }
      },
      small_rings());
  const auto start = Clock::now();
  EXPECT_EQ(job.result(0), "before dying|1 exited");
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(job.result(1), "(no result: the process died)");
}

}  // namespace
}  // namespace nezha::transport
