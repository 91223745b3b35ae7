// Failure behaviour: timeouts, dead peers, abort, strangers on the listener, wrong secrets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "tcp_mesh.h"
#include "transport/tcp/frame_stream.h"
#include "transport/tcp/socket.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::loopback_config;
using testing::make_mesh;
using testing::pattern;
using testing::run_ranks;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A plain TCP client connected to `endpoint`, as a stranger would be.
tcp::Fd dial(const std::string& endpoint) {
  tcp::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const sockaddr_in to = tcp::parse_ipv4_endpoint(endpoint);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0)
    throw std::runtime_error("test client could not connect to " + endpoint);
  return fd;
}

TEST(TcpRailFaults, RecvTimeoutNamesPeerRailAndTagWithinBoundedTime) {
  auto rails = make_mesh(2);
  uint8_t buf[4];
  const auto start = Clock::now();
  try {
    rails[0]->recv(1, 0xbeef, buf, sizeof buf, Deadline::after_seconds(0.3));
    FAIL() << "recv returned without data";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(what.find("rail lo: timed out after 0.3 s waiting for rank 1 (tag 0xbeef)"), std::string::npos) << what;
  }
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 1.5);
  // The connection was closed with the timeout; later calls fail at once.
  EXPECT_THROW(rails[0]->send(1, 1, buf, sizeof buf, Deadline::after_seconds(5)), PeerError);
}

TEST(TcpRailFaults, PeerThatClosesIsAPeerError) {
  auto rails = make_mesh(3);
  rails[1]->close();
  uint8_t buf[64];
  try {
    rails[0]->recv(1, 3, buf, sizeof buf, Deadline::after_seconds(5));
    FAIL() << "recv from a closed peer returned";
  } catch (const TimeoutError&) {
    FAIL() << "EOF reported as a timeout";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
    const std::string what = e.what();
    EXPECT_NE(what.find("rail lo"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("closed"), std::string::npos) << what;
  }
  // Sending more than the socket buffers to the dead peer fails too (EPIPE/ECONNRESET, no SIGPIPE).
  std::vector<uint8_t> big(8 << 20);
  EXPECT_THROW(rails[2]->send(1, 3, big.data(), big.size(), Deadline::after_seconds(5)), PeerError);
  // The rest of the mesh is unaffected.
  run_ranks(3, [&](int me) {
    if (me == 1) return;
    const int other = me == 0 ? 2 : 0;
    auto out = pattern(me, 0, 5000);
    std::vector<uint8_t> in(5000);
    rails[me]->sendrecv(other, out.data(), out.size(), other, in.data(), in.size(), 4, Deadline::after_seconds(5));
    EXPECT_EQ(first_mismatch(in, other, 0), -1);
  });
}

TEST(TcpRailFaults, AbortWakesABlockedRecvPromptly) {
  auto rails = make_mesh(2);
  auto blocked = std::async(std::launch::async, [&] {
    uint8_t buf[8];
    const auto start = Clock::now();
    try {
      rails[0]->recv(1, 1, buf, sizeof buf, Deadline::after_seconds(30));
      return std::string("returned");
    } catch (const TimeoutError&) {
      return std::string("timeout");
    } catch (const NezhaError& e) {
      return seconds_since(start) < 2 ? std::string(e.what()) : std::string("too slow");
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  rails[0]->abort("engine shutting down");
  EXPECT_EQ(blocked.get(), "rail lo aborted: engine shutting down");
  // Poisoned for good, first reason kept.
  rails[0]->abort("second reason");
  uint8_t b = 0;
  try {
    rails[0]->send(1, 2, &b, 1, Deadline::after_seconds(1));
    FAIL() << "send on an aborted rail";
  } catch (const NezhaError& e) {
    EXPECT_STREQ(e.what(), "rail lo aborted: engine shutting down");
  }
}

// One round of strangers at every rank's listener: one writes garbage, one connects and stays
// silent (returned, kept open by the caller), one speaks the protocol with the wrong secret.
std::vector<tcp::Fd> stranger_round(const std::vector<std::unique_ptr<TcpRail>>& rails) {
  std::vector<tcp::Fd> silent;
  const int n = static_cast<int>(rails.size());
  for (int r = 0; r < n; ++r) {
    const std::string addr = rails[r]->local_address();
    tcp::Fd garbage = dial(addr);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT_EQ(::write(garbage.get(), junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
    silent.push_back(dial(addr));
    tcp::Fd liar = dial(addr);
    tcp::set_nonblocking(liar.get());
    ConnectorHandshake hs(HandshakeParams{"wrong-secret", (r + 1) % n, n, 0}, r);
    tcp::write_frame(liar.get(), FrameType::kHello, hs.hello(), -1, Deadline::after_seconds(5));
    std::string payload;
    tcp::read_frame(liar.get(), 64, &payload, -1, Deadline::after_seconds(5));
    EXPECT_THROW(hs.on_challenge(payload), AuthenticationError);  // the rail's proof fails for us
  }
  return silent;
}

TEST(TcpRailFaults, StrangersOnTheListenerDoNotDisturbARunningExchange) {
  auto rails = make_mesh(3);
  // Silent strangers are already connected when the exchange starts; more arrive during it.
  std::vector<tcp::Fd> silent = stranger_round(rails);
  auto strangers = std::async(std::launch::async, [&] {
    std::vector<tcp::Fd> more;
    for (int round = 0; round < 5; ++round) {
      for (auto& fd : stranger_round(rails)) more.push_back(std::move(fd));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return more.size();
  });
  run_ranks(3, [&](int me) {
    const int right = (me + 1) % 3, left = (me + 2) % 3;
    for (size_t m = 0; m < 40; ++m) {
      auto out = pattern(me, m, 256 * 1024 + m);
      std::vector<uint8_t> in(out.size());
      rails[me]->sendrecv(right, out.data(), out.size(), left, in.data(), in.size(), m, Deadline::after_seconds(20));
      EXPECT_EQ(first_mismatch(in, left, m), -1) << "rank " << me << " message " << m;
    }
  });
  EXPECT_EQ(strangers.get(), 15u);
}

TEST(TcpRailFaults, SilentStrangerDoesNotDelayConnectAll) {
  TcpRailConfig config = loopback_config();
  config.handshake_timeout_s = 5;
  std::vector<std::unique_ptr<TcpRail>> rails;
  std::vector<std::string> addrs;
  for (int r = 0; r < 3; ++r) {
    rails.push_back(std::make_unique<TcpRail>(config, r, 3));
    addrs.push_back(rails.back()->local_address());
  }
  // Strangers get to rank 0 and 1 first; handshakes run concurrently, so ranks 1 and 2 are not
  // queued behind them for the 5 s handshake timeout.
  tcp::Fd s0 = dial(addrs[0]), s1 = dial(addrs[1]);
  const auto start = Clock::now();
  run_ranks(3, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(TcpRailFaults, SilentStrangerIsDisconnectedAfterTheHandshakeTimeout) {
  TcpRailConfig config = loopback_config();
  config.handshake_timeout_s = 0.2;
  TcpRail rail(config, 0, 2);
  tcp::Fd stranger = dial(rail.local_address());
  const timeval limit{5, 0};  // the test itself must not hang if the rail never hangs up
  ASSERT_EQ(setsockopt(stranger.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit), 0);
  const auto start = Clock::now();
  char byte;
  // Blocks until the rail hangs up on us: EOF (0) or a reset (-1), never data.
  const ssize_t r = ::recv(stranger.get(), &byte, 1, 0);
  EXPECT_LE(r, 0);
  EXPECT_GE(seconds_since(start), 0.15);
  EXPECT_LT(seconds_since(start), 1.5);
}

TEST(TcpRailFaults, WrongSecretFailsConnectAllNamingTheRanks) {
  TcpRailConfig good = loopback_config("right"), bad = loopback_config("wrong");
  TcpRail r0(good, 0, 2), r1(bad, 1, 2);
  const std::vector<std::string> addrs = {r0.local_address(), r1.local_address()};
  std::string err0, err1;
  run_ranks(2, [&](int r) {
    try {
      (r == 0 ? r0 : r1).connect(addrs, Deadline::after_seconds(1.0));
    } catch (const NezhaError& e) {
      (r == 0 ? err0 : err1) = e.what();
    }
  });
  EXPECT_NE(err1.find("handshake with rank 0"), std::string::npos) << err1;
  EXPECT_NE(err1.find("secrets differ"), std::string::npos) << err1;
  EXPECT_NE(err0.find("rank 1 never connected"), std::string::npos) << err0;
}

TEST(TcpRailFaults, ConnectAllTimesOutNamingMissingRanks) {
  // Rank 1 of a 3-rank job: rank 0 is unreachable (nobody listens there) and rank 2 never shows up.
  tcp::Fd placeholder(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in any = tcp::ipv4_address("127.0.0.1", 0);
  ASSERT_EQ(::bind(placeholder.get(), reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  const std::string dead = tcp::local_endpoint(placeholder.get());  // bound, not listening
  TcpRail rail(loopback_config(), 1, 3);
  const auto start = Clock::now();
  try {
    rail.connect({dead, rail.local_address(), "127.0.0.1:9"}, Deadline::after_seconds(0.5));
    FAIL() << "connect succeeded without peers";
  } catch (const NezhaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 at " + dead), std::string::npos) << what;
    EXPECT_NE(what.find("rank 2 never connected"), std::string::npos) << what;
  }
  EXPECT_LT(seconds_since(start), 2.0);
}

}  // namespace
}  // namespace nezha::transport
