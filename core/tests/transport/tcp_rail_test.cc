// Data-path tests: full meshes of 2, 3 and 4 ranks exchanging real bytes, checked byte by byte.
#include <gtest/gtest.h>

#include "tcp_mesh.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::make_mesh;
using testing::pattern;
using testing::run_ranks;

const Deadline kGenerous() { return Deadline::after_seconds(30); }

class TcpMesh : public ::testing::TestWithParam<int> {};

TEST_P(TcpMesh, EveryPairSendsAndReceivesInOrder) {
  const int n = GetParam();
  auto rails = make_mesh(n);
  const std::vector<size_t> sizes = {0, 1, 7, 4097, 300001};
  // In step s every rank sends every size to rank me+s while receiving from rank me-s.
  run_ranks(n, [&](int me) {
    TcpRail& rail = *rails[me];
    for (int step = 1; step < n; ++step) {
      const int to = (me + step) % n, from = (me - step + n) % n;
      for (size_t m = 0; m < sizes.size(); ++m) {
        auto out = pattern(me, m, sizes[m]);
        std::vector<uint8_t> in(sizes[m], 0xAA);
        rail.sendrecv(to, out.data(), out.size(), from, in.data(), in.size(), step * 100 + m, kGenerous());
        EXPECT_EQ(first_mismatch(in, from, m), -1) << "rank " << me << " from " << from << " size " << sizes[m];
      }
    }
  });
  // Plain send/recv: rank 0 fans out to everyone, then everyone answers.
  run_ranks(n, [&](int me) {
    TcpRail& rail = *rails[me];
    if (me == 0) {
      for (int p = 1; p < n; ++p) {
        auto out = pattern(0, p, 1000 + p);
        rail.send(p, 7, out.data(), out.size(), kGenerous());
      }
      for (int p = 1; p < n; ++p) {
        std::vector<uint8_t> in(2000 + p);
        rail.recv(p, 8, in.data(), in.size(), kGenerous());
        EXPECT_EQ(first_mismatch(in, p, 0), -1) << "from " << p;
      }
    } else {
      std::vector<uint8_t> in(1000 + me);
      rail.recv(0, 7, in.data(), in.size(), kGenerous());
      EXPECT_EQ(first_mismatch(in, 0, me), -1) << "rank " << me;
      auto out = pattern(me, 0, 2000 + me);
      rail.send(0, 8, out.data(), out.size(), kGenerous());
    }
  });
}

TEST_P(TcpMesh, RingSendrecvOfManySizesIncludingLarge) {
  const int n = GetParam();
  auto rails = make_mesh(n);
  // 64 MiB + 1 is 64x the socket buffers: deadlocks unless send and receive progress together (on
  // 2 ranks both directions share one connection).
  const std::vector<size_t> sizes = {0, 1, 3, 65537, 1000003, (size_t{64} << 20) + 1};
  run_ranks(n, [&](int me) {
    TcpRail& rail = *rails[me];
    const int right = (me + 1) % n, left = (me - 1 + n) % n;
    for (size_t m = 0; m < sizes.size(); ++m) {
      auto out = pattern(me, m, sizes[m]);
      std::vector<uint8_t> in(sizes[m]);
      rail.sendrecv(right, out.data(), out.size(), left, in.data(), in.size(), 1000 + m, kGenerous());
      EXPECT_EQ(first_mismatch(in, left, m), -1) << "rank " << me << " size " << sizes[m];
    }
  });
  uint64_t total = 0;
  for (size_t s : sizes) total += s;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(rails[r]->counters().bytes_sent, total) << "rank " << r;
    EXPECT_EQ(rails[r]->counters().bytes_received, total) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpMesh, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(TcpRail, PropertiesDescribeTheRail) {
  auto rails = make_mesh(2);
  const RailProperties& p = rails[0]->properties();
  EXPECT_EQ(p.name, "lo");
  EXPECT_EQ(p.local_addr, "127.0.0.1");
  EXPECT_EQ(p.kind, "tcp");
  EXPECT_EQ(rails[0]->as_collective(), nullptr);
  EXPECT_EQ(rails[0]->as_point_to_point(), rails[0].get());
  EXPECT_EQ(rails[1]->rank(), 1);
  EXPECT_EQ(rails[1]->size(), 2);
  EXPECT_EQ(rails[0]->local_address().rfind("127.0.0.1:", 0), 0u) << rails[0]->local_address();
}

TEST(TcpRail, InvalidPeerIsAnInvalidArgument) {
  auto rails = make_mesh(2);
  uint8_t b = 0;
  EXPECT_THROW(rails[0]->send(0, 1, &b, 1, kGenerous()), InvalidArgument);
  EXPECT_THROW(rails[0]->recv(2, 1, &b, 1, kGenerous()), InvalidArgument);
  EXPECT_THROW(rails[0]->send(-1, 1, &b, 1, kGenerous()), InvalidArgument);
}

TEST(TcpRail, WrongTagOrLengthIsAProtocolErrorAndClosesThePeer) {
  auto rails = make_mesh(3);
  uint8_t out[16] = {1, 2, 3}, in[16];
  rails[1]->send(0, 5, out, sizeof out, kGenerous());
  try {
    rails[0]->recv(1, 6, in, sizeof in, kGenerous());
    FAIL() << "wrong tag accepted";
  } catch (const ProtocolError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rail lo: frame from rank 1 has tag 0x5 where 0x6 was expected"), std::string::npos) << what;
  }
  // The connection to rank 1 is closed; the error is immediate and names the first failure.
  const auto start = Clock::now();
  try {
    rails[0]->recv(1, 7, in, sizeof in, kGenerous());
    FAIL() << "closed peer accepted";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("tag 0x5"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(100));

  rails[2]->send(0, 9, out, 8, kGenerous());
  try {
    rails[0]->recv(2, 9, in, sizeof in, kGenerous());
    FAIL() << "wrong length accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("length 8 where 16 was expected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::transport
