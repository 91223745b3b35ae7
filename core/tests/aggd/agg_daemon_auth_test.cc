// nezha-aggd against strangers and broken peers: a connection speaking another protocol, a rank with
// the wrong key, a malformed frame from an authenticated rank, a join that does not fit the pool.
// Each is refused or fails its own job; the daemon keeps serving a healthy job meanwhile.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "aggd/agg_cluster.h"
#include "aggd/agg_job.h"
#include "common/error.h"
#include "transport/agg/agg_protocol.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/tcp/socket.h"

namespace nezha::aggd {
namespace {

using namespace transport::agg;
using testing::connect_all;
using testing::make_job;
using testing::start_daemon;
using transport::testing::run_ranks;

// A blocking raw client, to send what a real rail never would.
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : fd_(transport::tcp::open_stream_socket(false)) {
    const sockaddr_in to = transport::tcp::parse_ipv4_endpoint(endpoint);
    EXPECT_EQ(transport::tcp::connect_with_deadline(fd_.get(), to, -1, Deadline::after_seconds(5)), 0);
  }
  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) off += static_cast<size_t>(n);
      else if (errno == EAGAIN) wait(POLLOUT);
      else return;  // the daemon closed on us: what the tests look for next
    }
  }
  // One frame (header + payload), or "" on EOF / timeout.
  AggFrame recv_frame(std::string* storage) {
    storage->clear();
    for (;;) {
      AggFrame f;
      if (decode_agg_frame(reinterpret_cast<const uint8_t*>(storage->data()), storage->size(), 1 << 20, &f)) {
        return f;
      }
      char b[4096];
      if (!wait(POLLIN)) return {};
      const ssize_t n = ::recv(fd_.get(), b, sizeof b, 0);
      if (n <= 0) return {};
      storage->append(b, static_cast<size_t>(n));
    }
  }
  // True once the daemon has closed the connection (EOF), within 5 s.
  bool closed_by_daemon() {
    char b[4096];
    const Deadline d = Deadline::after_seconds(5);
    while (!d.expired()) {
      if (!wait(POLLIN)) return false;
      const ssize_t n = ::recv(fd_.get(), b, sizeof b, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
    return false;
  }
  // Authenticates with `secret` and joins job `job` as `rank` of `size`; true if joined.
  bool join(const std::string& secret, uint64_t job, int rank, int size) {
    transport::ConnectorHandshake hs({secret, rank, size, kAggRailIndex}, size);
    AggHeader h;
    h.job = job;
    h.rank = static_cast<uint16_t>(rank);
    std::string hello = hs.hello(), st;
    h.type = AggType::kHello;
    send(encode_agg_frame(h, hello.data(), hello.size()));
    AggFrame f = recv_frame(&st);
    if (f.header.type != AggType::kChallenge) return false;
    const std::string resp = hs.on_challenge(std::string(reinterpret_cast<const char*>(f.payload), f.header.length));
    h.type = AggType::kAuthResponse;
    send(encode_agg_frame(h, resp.data(), resp.size()));
    f = recv_frame(&st);
    if (f.header.type != AggType::kAuthResult || f.payload[0] != 1) return false;
    h.type = AggType::kJoin;
    h.seq = 1;
    const std::string join = encode_join_payload({static_cast<uint32_t>(size), 4, 4096});
    send(encode_agg_frame(h, join.data(), join.size()));
    f = recv_frame(&st);
    return f.header.type == AggType::kJoined;
  }

 private:
  bool wait(short events) {
    bool woken = false;
    return transport::tcp::poll_one(fd_.get(), events, -1, Deadline::after_seconds(5), &woken) != 0;
  }
  transport::tcp::Fd fd_;
};

// A healthy 2-rank job that must keep working whatever the others do.
void healthy_allreduce(testing::AggJobRails& job, float value) {
  std::vector<std::vector<float>> v(2, std::vector<float>(3000, value));
  run_ranks(2, [&](int r) {
    job.rails[r]->start_allreduce(v[r].data(), v[r].data(), 3000, DataType::kFloat32, ReduceOp::kSum, 0)
        ->wait(Deadline::after_seconds(10));
  });
  for (auto& x : v)
    for (float e : x) ASSERT_EQ(e, 2 * value);
}

TEST(AggDaemonAuth, AStrangerSpeakingAnotherProtocolIsClosedAndOthersGoOn) {
  auto daemon = start_daemon();
  auto job = make_job(*daemon, 2);
  connect_all(job);
  RawClient stranger(daemon->address());
  stranger.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(stranger.closed_by_daemon());
  healthy_allreduce(job, 1.5f);
}

TEST(AggDaemonAuth, AWrongKeyIsRefusedNamingTheKey) {
  auto daemon = start_daemon("right-key");
  auto bad = make_job(*daemon, 1, "wrong-key");
  try {
    connect_all(bad);
    FAIL() << "a rank with the wrong key joined";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("key"), std::string::npos) << e.what();
  }
  // The rank gives up first; the daemon counts the refusal when the rank's rejection arrives.
  const Deadline d = Deadline::after_seconds(5);
  while (daemon->stats().refused == 0 && !d.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GE(daemon->stats().refused, 1u);
  auto good = make_job(*daemon, 2, "right-key");
  connect_all(good);
  healthy_allreduce(good, 2.0f);
}

TEST(AggDaemonAuth, AMalformedChunkFailsItsJobOnly) {
  auto daemon = start_daemon();
  auto healthy = make_job(*daemon, 2);
  connect_all(healthy);
  RawClient r0(daemon->address()), r1(daemon->address());
  ASSERT_TRUE(r0.join("daemon-key", 77, 0, 2));
  ASSERT_TRUE(r1.join("daemon-key", 77, 1, 2));
  AggHeader h;
  h.type = AggType::kChunk;
  h.job = 77;
  h.dtype = DataType::kFloat32;
  h.count = 10;
  h.chunks = 1;
  std::string payload(12, '\0');  // 12 bytes where 10 floats (40 bytes) are due
  r0.send(encode_agg_frame(h, payload.data(), payload.size()));
  std::string st;
  AggFrame f = r1.recv_frame(&st);  // the peer rank is told, with the cause
  EXPECT_EQ(f.header.type, AggType::kError);
  const std::string text(reinterpret_cast<const char*>(f.payload), f.header.length);
  EXPECT_NE(text.find("sent 12 bytes in chunk 0, expected 40"), std::string::npos) << text;
  EXPECT_TRUE(r0.closed_by_daemon());
  healthy_allreduce(healthy, 3.0f);
  EXPECT_EQ(daemon->stats().job_errors, 1u);
}

TEST(AggDaemonAuth, AJoinThatDoesNotFitThePoolIsRefused) {
  auto daemon = start_daemon("daemon-key", /*pool_bytes=*/AggJob::reserved_bytes({2, 4, 4096}));
  auto first = make_job(*daemon, 2);
  connect_all(first);
  auto second = make_job(*daemon, 2);
  try {
    connect_all(second);
    FAIL() << "a job beyond the pool was admitted";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("pool full"), std::string::npos) << e.what();
  }
  healthy_allreduce(first, 0.5f);
}

}  // namespace
}  // namespace nezha::aggd
