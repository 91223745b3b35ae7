// Control-plane messages: send_message / recv_message_any / read_polled, ordering, partial reads,
// wake_fd.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>

#include "tcp_mesh.h"

namespace nezha::transport {
namespace {

using testing::make_mesh;
using testing::run_ranks;

std::string message_text(int sender, int i, size_t bytes) {
  std::string s(bytes, '\0');
  for (size_t k = 0; k < bytes; ++k) s[k] = static_cast<char>('a' + (sender * 7 + i * 3 + k) % 26);
  return s;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(TcpControl, MessagesFromManyPeersArriveWholeAndInOrderPerPeer) {
  const int n = 4;
  auto rails = make_mesh(n);
  const std::vector<size_t> sizes = {0, 1, 17, 4096, 100000, 0, 3};
  run_ranks(n, [&](int me) {
    if (me != 0) {
      for (size_t i = 0; i < sizes.size(); ++i)
        rails[me]->send_message(0, message_text(me, static_cast<int>(i), sizes[i]), Deadline::after_seconds(10));
      return;
    }
    std::map<int, int> next;  // per peer: index of the next expected message
    for (size_t got = 0; got < (n - 1) * sizes.size(); ++got) {
      auto msg = rails[0]->recv_message_any(-1, Deadline::after_seconds(10));
      ASSERT_TRUE(msg.has_value()) << "timed out after " << got << " messages";
      const int i = next[msg->peer]++;
      EXPECT_EQ(msg->payload, message_text(msg->peer, i, sizes[i])) << "from rank " << msg->peer << " #" << i;
    }
    for (int p = 1; p < n; ++p) EXPECT_EQ(next[p], static_cast<int>(sizes.size())) << "rank " << p;
  });
}

TEST(TcpControl, ReplyRoundTripsBetweenCoordinatorAndWorkers) {
  const int n = 3;
  auto rails = make_mesh(n);
  run_ranks(n, [&](int me) {
    for (int round = 0; round < 20; ++round) {
      if (me == 0) {
        std::string all;
        for (int k = 1; k < n; ++k) {
          auto msg = rails[0]->recv_message_any(-1, Deadline::after_seconds(10));
          ASSERT_TRUE(msg);
          all += msg->payload;
        }
        for (int p = 1; p < n; ++p) rails[0]->send_message(p, std::to_string(all.size()), Deadline::after_seconds(10));
      } else {
        rails[me]->send_message(0, std::string(me * 10 + round, 'x'), Deadline::after_seconds(10));
        auto reply = rails[me]->recv_message_any(-1, Deadline::after_seconds(10));
        ASSERT_TRUE(reply);
        EXPECT_EQ(reply->peer, 0);
        EXPECT_EQ(reply->payload, std::to_string(10 + 20 + 2 * round));  // sum over ranks 1 and 2
      }
    }
  });
}

TEST(TcpControl, PartialMessageSurvivesManyShortWaits) {
  auto rails = make_mesh(2);
  const std::string big = message_text(1, 0, 8 << 20);  // 8x the socket buffers
  auto sender = std::async(std::launch::async, [&] {
    rails[1]->send_message(0, big, Deadline::after_seconds(20));
    rails[1]->send_message(0, "after", Deadline::after_seconds(20));
  });
  // Let the sender fill the socket buffers and block, so the first call finds only part of it.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int empty_waits = 0;
  std::optional<TcpRail::Message> msg;
  // An already-expired deadline: each call takes only what has arrived so far.
  while (!msg) {
    msg = rails[0]->recv_message_any(-1, Deadline::after_seconds(0));
    if (msg) break;
    ++empty_waits;
    ASSERT_LT(empty_waits, 200000);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  sender.get();
  EXPECT_GT(empty_waits, 0) << "the message arrived in one call; the test did not cover partial reads";
  EXPECT_EQ(msg->payload.size(), big.size());
  EXPECT_TRUE(msg->payload == big);
  auto second = rails[0]->recv_message_any(-1, Deadline::after_seconds(5));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->payload, "after");
}

TEST(TcpControl, WakeFdEndsTheWaitWithoutBeingConsumed) {
  auto rails = make_mesh(2);
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(wake, 0);
  auto waker = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t one = 1;
    EXPECT_EQ(::write(wake, &one, sizeof one), 8);
  });
  const auto start = Clock::now();
  EXPECT_FALSE(rails[0]->recv_message_any(wake, Deadline::after_seconds(10)).has_value());
  EXPECT_LT(seconds_since(start), 2.0);
  waker.get();
  uint64_t count = 0;
  EXPECT_EQ(::read(wake, &count, sizeof count), 8) << "recv_message_any consumed the wake_fd";
  EXPECT_EQ(count, 1u);
  // A message that is already waiting still comes first when the wake fd is readable too.
  rails[1]->send_message(0, "hi", Deadline::after_seconds(5));
  const uint64_t one = 1;
  ASSERT_EQ(::write(wake, &one, sizeof one), 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto msg = rails[0]->recv_message_any(wake, Deadline::after_seconds(5));
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->payload, "hi");
  ::close(wake);
}

TEST(TcpControl, DeadlineReturnsNulloptInBoundedTime) {
  auto rails = make_mesh(2);
  const auto start = Clock::now();
  EXPECT_FALSE(rails[1]->recv_message_any(-1, Deadline::after_seconds(0.2)).has_value());
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.19);
  EXPECT_LT(took, 1.0);
}

// The control channel's way to read several paths: one poll() over every path's descriptors, then
// read_polled() on each path with what that poll found, with no poll or wait of its own.
std::vector<TcpRail::Message> poll_then_read(TcpRail& rail, int timeout_ms) {
  std::vector<pollfd> fds;
  rail.append_poll_fds(fds);
  ::poll(fds.data(), fds.size(), timeout_ms);
  std::vector<TcpRail::Message> got;
  rail.read_polled(fds.data(), fds.size(), got);
  return got;
}

TEST(TcpControl, ReadPolledTakesEveryWholeMessageThePollFoundInOrderPerPeer) {
  const int n = 3, per_peer = 300;
  auto rails = make_mesh(n);
  // Nothing readable: returns at once with nothing, though nothing was polled for long.
  EXPECT_TRUE(poll_then_read(*rails[0], 0).empty());
  // Many small messages and two longer than one read's room (16 KiB), all sent before rank 0 reads
  // (~70 KB a peer: within the socket buffers): one read takes many messages, and the long ones
  // straddle reads.
  auto size_of = [](int i) { return i % 150 == 7 ? size_t{20000} : static_cast<size_t>(i % 40); };
  std::atomic<int> senders_done{0};
  run_ranks(n, [&](int me) {
    if (me != 0) {
      for (int i = 0; i < per_peer; ++i)
        rails[me]->send_message(0, message_text(me, i, size_of(i)), Deadline::after_seconds(10));
      ++senders_done;
      return;
    }
    while (senders_done < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::map<int, int> next;
    const auto start = Clock::now();
    int polls = 0;
    while (next[1] + next[2] < 2 * per_peer) {
      ASSERT_LT(seconds_since(start), 20.0) << "got " << next[1] << " + " << next[2];
      ++polls;
      for (auto& m : poll_then_read(*rails[0], 100)) {
        const int i = next[m.peer]++;
        ASSERT_EQ(m.payload, message_text(m.peer, i, size_of(i))) << "from rank " << m.peer << " #" << i;
      }
    }
    EXPECT_LT(polls, per_peer / 4) << "reads took one message or few at a time";
  });
}

TEST(TcpControl, ReadPolledHandsOverAPeersLastWordsBeforeItsLoss) {
  auto rails = make_mesh(3);
  rails[2]->send_message(0, "last words", Deadline::after_seconds(5));
  rails[2]->close();
  std::vector<std::string> got;
  const auto start = Clock::now();
  for (;;) {
    ASSERT_LT(seconds_since(start), 10.0) << "the closed peer was never reported";
    std::vector<pollfd> fds;
    rails[0]->append_poll_fds(fds);
    ::poll(fds.data(), fds.size(), 100);
    std::vector<TcpRail::Message> out;
    try {
      rails[0]->read_polled(fds.data(), fds.size(), out);
    } catch (const PeerError& e) {
      EXPECT_EQ(e.peer(), 2);
      for (auto& m : out) got.push_back(m.payload);
      break;
    }
    for (auto& m : out) got.push_back(m.payload);
  }
  EXPECT_EQ(got, std::vector<std::string>{"last words"});
  EXPECT_THROW(rails[0]->send_message(2, "x", Deadline::after_seconds(1)), PeerError);
  // The rail goes on with the others.
  rails[1]->send_message(0, "still here", Deadline::after_seconds(5));
  auto msg = rails[0]->recv_message_any(-1, Deadline::after_seconds(5));
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->peer, 1);
  EXPECT_EQ(msg->payload, "still here");
}

TEST(TcpControl, PeerLossIsAPeerErrorAndAbortWakesTheWait) {
  auto rails = make_mesh(3);
  rails[2]->close();
  try {
    rails[0]->recv_message_any(-1, Deadline::after_seconds(5));
    FAIL() << "no error for a closed peer";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 2);
  }
  auto waiting = std::async(std::launch::async, [&] {
    try {
      rails[0]->recv_message_any(-1, Deadline::after_seconds(30));
      return std::string("returned");
    } catch (const NezhaError& e) {
      return std::string(e.what());
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  rails[0]->abort("stop");
  EXPECT_EQ(waiting.get(), "rail lo aborted: stop");
}

TEST(TcpControl, DataFrameWhereAControlMessageIsExpectedIsAProtocolError) {
  auto rails = make_mesh(2);
  uint8_t b = 1;
  rails[1]->send(0, 0, &b, 1, Deadline::after_seconds(5));
  try {
    rails[0]->recv_message_any(-1, Deadline::after_seconds(5));
    FAIL() << "data frame accepted as a control message";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("type data where control was expected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::transport
