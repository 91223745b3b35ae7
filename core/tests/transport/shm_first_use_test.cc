// ShmRail links a pair on its first data call: connect() makes no handoff, one exchange links both
// ends, a rank that never talks to another costs it nothing, and a first link that cannot complete
// (abort, deadline, a closed peer, a forged request) fails naming the peer.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "shm_mesh.h"
#include "tcp_mesh.h"
#include "transport/shm/shm_address.h"
#include "transport/shm/shm_segment.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::make_shm_mesh;
using testing::pattern;
using testing::run_ranks;
using testing::small_ring_config;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t total_fetched(const std::vector<std::unique_ptr<ShmRail>>& rails) {
  uint64_t n = 0;
  for (const auto& r : rails) n += r->handoffs().fetched;
  return n;
}
uint64_t total_served(const std::vector<std::unique_ptr<ShmRail>>& rails) {
  uint64_t n = 0;
  for (const auto& r : rails) n += r->handoffs().served;
  return n;
}

TEST(ShmFirstUse, ConnectMakesNoHandoffAndOneExchangeLinksBothEnds) {
  const int n = 4;
  auto rails = make_shm_mesh(n);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(rails[r]->handoffs().fetched, 0u) << "rank " << r;
    EXPECT_EQ(rails[r]->handoffs().served, 0u) << "rank " << r;
    for (int q = 0; q < n; ++q) EXPECT_EQ(rails[r]->reaches(q), q != r) << r << " -> " << q;
  }
  const Deadline d = Deadline::after_seconds(10);
  // Rank 0 sends first (the ring buffers it) and fetches rank 1's segment, handing over its own;
  // rank 1 then receives without a handoff of its own.
  const auto msg = pattern(0, 1, 1000);
  rails[0]->send(1, 1, msg.data(), msg.size(), d);
  std::vector<uint8_t> got(1000);
  rails[1]->recv(0, 1, got.data(), got.size(), d);
  EXPECT_EQ(first_mismatch(got, 0, 1), -1);
  // And back: the pair is linked both ways already.
  const auto reply = pattern(1, 2, 300);
  rails[1]->send(0, 2, reply.data(), reply.size(), d);
  std::vector<uint8_t> got_reply(300);
  rails[0]->recv(1, 2, got_reply.data(), got_reply.size(), d);
  EXPECT_EQ(first_mismatch(got_reply, 1, 2), -1);

  EXPECT_EQ(rails[0]->handoffs().fetched, 1u);
  EXPECT_EQ(rails[0]->handoffs().served, 0u);
  EXPECT_EQ(rails[1]->handoffs().fetched, 0u);
  EXPECT_EQ(rails[1]->handoffs().served, 1u);
  for (int r : {2, 3}) {  // never talked to anyone: no handoff at all
    EXPECT_EQ(rails[r]->handoffs().fetched, 0u) << "rank " << r;
    EXPECT_EQ(rails[r]->handoffs().served, 0u) << "rank " << r;
  }
}

TEST(ShmFirstUse, PairsLinkedFromBothEndsAtOnceInASendrecvRing) {
  const int n = 5;
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct" : "streamed");
    ShmRailConfig config = small_ring_config();
    config.direct = direct;
    auto rails = make_shm_mesh(n, config);
    const size_t bytes = (1 << 20) + 5;  // 16 rings' worth: both directions progress together
    run_ranks(n, [&](int r) {
      const Deadline d = Deadline::after_seconds(30);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      for (int round = 0; round < 2; ++round) {  // forwards, then backwards over the same pairs
        const int to = round == 0 ? next : prev, from = round == 0 ? prev : next;
        const auto out = pattern(r, round, bytes);
        std::vector<uint8_t> in(bytes);
        rails[r]->sendrecv_tags(to, out.data(), bytes, round, from, in.data(), bytes, round, d);
        EXPECT_EQ(first_mismatch(in, from, round), -1) << "rank " << r << " round " << round;
      }
    });
    // Each of the ring's n pairs was linked by one exchange, or two where both ends asked at once.
    EXPECT_GE(total_fetched(rails), static_cast<uint64_t>(n));
    EXPECT_LE(total_fetched(rails), static_cast<uint64_t>(2 * n));
    EXPECT_EQ(total_fetched(rails), total_served(rails));
    for (int r = 0; r < n; ++r) EXPECT_LE(rails[r]->handoffs().fetched, 2u) << "rank " << r;
  }
}

TEST(ShmFirstUse, AbortWhileAPeersHandoffIsPendingWakesAndNamesIt) {
  // Rank 1 never connects: its socket listens, but nothing serves its segment yet.
  ShmRail r0(small_ring_config(), 0, 2), r1(small_ring_config(), 1, 2);
  const std::vector<std::string> addrs{r0.local_address(), r1.local_address()};
  r0.connect(addrs, Deadline::after_seconds(5));
  std::string error;
  double waited = 0;
  std::thread waiter([&] {
    const auto t = Clock::now();
    try {
      std::vector<uint8_t> buf(8);
      r0.recv(1, 1, buf.data(), buf.size(), Deadline::after_seconds(30));
    } catch (const std::exception& e) {
      error = e.what();
    }
    waited = seconds_since(t);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  r0.abort("test abort");
  waiter.join();
  EXPECT_LT(waited, 1.0);
  EXPECT_NE(error.find("test abort"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1's segment"), std::string::npos) << error;
  EXPECT_EQ(r0.handoffs().fetched, 0u);
}

TEST(ShmFirstUse, DeadlineWhileAHandoffIsPendingIsTimeoutAndClosesThePair) {
  ShmRail r0(small_ring_config(), 0, 2), r1(small_ring_config(), 1, 2);
  const std::vector<std::string> addrs{r0.local_address(), r1.local_address()};
  r0.connect(addrs, Deadline::after_seconds(5));
  std::vector<uint8_t> buf(8);
  const auto t = Clock::now();
  try {
    r0.send(1, 1, buf.data(), buf.size(), Deadline::after_seconds(0.3));
    FAIL() << "send to a peer that never serves its segment returned";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("shm-test"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hand over its segment"), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(t), 0.29);
  EXPECT_LT(seconds_since(t), 2.0);
  EXPECT_FALSE(r0.reaches(1));
  const auto t2 = Clock::now();
  EXPECT_THROW(r0.recv(1, 1, buf.data(), buf.size(), Deadline::after_seconds(5)), PeerError);
  EXPECT_LT(seconds_since(t2), 0.1);
}

TEST(ShmFirstUse, APeerWhoseRailIsClosedIsNamedAtOnce) {
  auto rails = make_shm_mesh(3);
  rails[2]->close();
  std::vector<uint8_t> buf(8);
  const auto t = Clock::now();
  try {
    rails[0]->send(2, 1, buf.data(), buf.size(), Deadline::after_seconds(10));
    FAIL() << "send to a closed rail returned";
  } catch (const TimeoutError& e) {
    FAIL() << "a closed peer must not take the deadline: " << e.what();
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 2);
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t), 1.0);
  // The other pairs are untouched.
  run_ranks(2, [&](int r) {
    const Deadline d = Deadline::after_seconds(10);
    if (r == 0) rails[0]->send(1, 3, "abcd", 4, d);
    else {
      std::vector<uint8_t> got(4);
      rails[1]->recv(0, 3, got.data(), 4, d);
      EXPECT_EQ(std::memcmp(got.data(), "abcd", 4), 0);
    }
  });
}

// Sends `request` (with fd attached, if >= 0) to the rail's handoff socket; returns whether an
// answer came back.
bool forged_request_answered(const std::string& socket_name, const std::string& request, int fd) {
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, socket_name.data(), socket_name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + socket_name.size());
  EXPECT_EQ(::connect(sock, reinterpret_cast<sockaddr*>(&addr), len), 0);
  iovec iov{const_cast<char*>(request.data()), request.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  EXPECT_EQ(::sendmsg(sock, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  timeval tv{5, 0};  // the server answers or hangs up at once; never wait forever
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char byte = 0;
  const ssize_t got = ::recv(sock, &byte, 1, 0);
  ::close(sock);
  return got == 1;
}

TEST(ShmFirstUse, ARequestWithoutTheRanksNonceOrSegmentIsRefused) {
  auto rails = make_shm_mesh(2);
  const auto addrs = testing::addresses_of(rails);
  const shm::ShmAddress target = shm::decode_address(addrs[0], "test");
  const shm::ShmAddress claimed = shm::decode_address(addrs[1], "test");
  const int32_t rank = 1;
  std::string wrong_nonce(4, '\0');
  std::memcpy(wrong_nonce.data(), &rank, 4);
  std::string right_nonce = wrong_nonce;
  wrong_nonce += std::string(16, 'x');
  right_nonce += shm::from_hex(claimed.nonce_hex, "test");
  const int memfd = ::memfd_create("forged", MFD_CLOEXEC);
  EXPECT_FALSE(forged_request_answered(target.socket_name, wrong_nonce, memfd));
  ::close(memfd);
  EXPECT_FALSE(forged_request_answered(target.socket_name, right_nonce, -1));  // no segment along
  EXPECT_EQ(rails[0]->handoffs().served, 0u);
  // The genuine rank 1 still links (same process, so its credentials match).
  run_ranks(2, [&](int r) {
    const Deadline d = Deadline::after_seconds(10);
    if (r == 1) rails[1]->send(0, 4, "wxyz", 4, d);
    else {
      std::vector<uint8_t> got(4);
      rails[0]->recv(1, 4, got.data(), 4, d);
      EXPECT_EQ(std::memcmp(got.data(), "wxyz", 4), 0);
    }
  });
}

TEST(ShmFirstUse, AClosedSegmentHandedOverWithARequestIsNotLinked) {
  // A request queued on a rank's socket can outlive the connection of the peer that sent it; the
  // segment it carries was closed by the peer's reset(). Here: a segment exactly like rank 1's,
  // marked closed, handed to rank 0 as if rank 1 had asked.
  auto rails = make_shm_mesh(2);
  const auto addrs = testing::addresses_of(rails);
  const shm::ShmAddress target = shm::decode_address(addrs[0], "test");
  const shm::ShmAddress one = shm::decode_address(addrs[1], "test");
  const std::string nonce = shm::from_hex(one.nonce_hex, "test");
  shm::Segment stale = shm::Segment::create({shm::sha256("nezha-shm-job\n" + small_ring_config().secret).substr(0, 16),
                                             nonce, one.pid, one.start_time, 1, 2, 64 << 10});
  stale.header()->closed.store(1);
  const int32_t rank = 1;
  std::string request(4, '\0');
  std::memcpy(request.data(), &rank, 4);
  EXPECT_TRUE(forged_request_answered(target.socket_name, request + nonce, stale.fd()));
  EXPECT_EQ(rails[0]->handoffs().served, 1u);
  // Rank 0's first send to rank 1 must reach rank 1's live segment, not the closed one.
  const auto msg = pattern(0, 5, 100);
  rails[0]->send(1, 5, msg.data(), msg.size(), Deadline::after_seconds(10));
  EXPECT_EQ(rails[0]->handoffs().fetched, 1u);
  std::vector<uint8_t> got(100);
  rails[1]->recv(0, 5, got.data(), got.size(), Deadline::after_seconds(5));
  EXPECT_EQ(first_mismatch(got, 0, 5), -1);
}

TEST(ShmFirstUse, AbortWakesAPeerThatLinkedUsBeforeWeLinkedIt) {
  // A long liveness slice: only the doorbell can wake the peer within the test's second.
  ShmRailConfig config = small_ring_config();
  config.liveness_slice_ms = 5000;
  auto rails = make_shm_mesh(2, config);
  std::string error;
  double waited = 0;
  std::thread waiter([&] {
    const auto t = Clock::now();
    try {
      std::vector<uint8_t> buf(8);
      rails[1]->recv(0, 1, buf.data(), buf.size(), Deadline::after_seconds(30));
    } catch (const std::exception& e) {
      error = e.what();
    }
    waited = seconds_since(t);
  });
  const Deadline linked = Deadline::after_seconds(10);
  while (rails[0]->handoffs().served == 0 && !linked.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(rails[0]->handoffs().served, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1 asleep on its doorbell
  const auto t = Clock::now();
  rails[0]->abort("test abort");
  waiter.join();
  EXPECT_LT(seconds_since(t), 1.0) << error;
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  EXPECT_GT(waited, 0.1);
}

}  // namespace
}  // namespace nezha::transport
