// TcpRail with connect_on_first_use: connect() makes no connection; the first transfer between two
// ranks does, whichever of them arrives first; a peer that never comes is named.
#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tcp_mesh.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::loopback_config;
using testing::make_mesh;
using testing::pattern;
using testing::run_ranks;

TcpRailConfig first_use_config() {
  TcpRailConfig c = loopback_config();
  c.connect_on_first_use = true;
  return c;
}

// Sockets open in this process (both ends of every connection among them).
int open_sockets() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* e = ::readdir(dir)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t len = ::readlink(path.c_str(), target, sizeof target - 1);
    n += len > 0 && std::string(target, static_cast<size_t>(len)).rfind("socket:", 0) == 0;
  }
  ::closedir(dir);
  return n;
}

TEST(TcpFirstUse, OnlyThePairsThatTransferAreConnected) {
  const int n = 5;
  const int before = open_sockets();
  auto rails = make_mesh(n, first_use_config());
  const int idle = open_sockets() - before;  // per rail its listener and link watch, no connection
  EXPECT_LE(idle, 2 * n);
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) EXPECT_EQ(rails[r]->reaches(q), q != r) << r << " -> " << q;
  EXPECT_GT(rails[0]->send_buffer_bytes(), 0u);

  // A ring: each rank sends to the next and receives from the previous, at once, twice.
  const size_t bytes = 3 << 20;  // larger than the socket buffers
  for (int round = 0; round < 2; ++round)
    run_ranks(n, [&](int r) {
      const auto msg = pattern(r, round, bytes);
      std::vector<uint8_t> got(bytes);
      rails[r]->sendrecv_tags((r + 1) % n, msg.data(), bytes, round, (r + n - 1) % n, got.data(), bytes, round,
                              Deadline::after_seconds(20));
      EXPECT_EQ(first_mismatch(got, (r + n - 1) % n, round), -1) << "rank " << r;
    });
  EXPECT_EQ(open_sockets() - before, idle + 2 * n);  // n ring pairs, both ends

  // Every pair, lower rank sending first: the rest of the mesh appears.
  run_ranks(n, [&](int r) {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const auto msg = pattern(r, 7, 100);
      std::vector<uint8_t> got(100);
      const Deadline d = Deadline::after_seconds(20);
      if (r < q) {
        rails[r]->send(q, 7, msg.data(), msg.size(), d);
        rails[r]->recv(q, 7, got.data(), got.size(), d);
      } else {
        rails[r]->recv(q, 7, got.data(), got.size(), d);
        rails[r]->send(q, 7, msg.data(), msg.size(), d);
      }
      EXPECT_EQ(first_mismatch(got, q, 7), -1) << r << " <- " << q;
    }
  });
  EXPECT_EQ(open_sockets() - before, idle + n * (n - 1));
}

TEST(TcpFirstUse, APeerThatNeverComesIsNamedAtTheDeadline) {
  auto rails = make_mesh(3, first_use_config());
  // Rank 0 waits for rank 2 to dial it (a higher rank dials); rank 2 never transfers.
  std::vector<uint8_t> got(8);
  try {
    rails[0]->recv(2, 1, got.data(), got.size(), Deadline::after_seconds(0.3));
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 2);
    EXPECT_NE(std::string(e.what()).find("rank 2 never connected"), std::string::npos) << e.what();
  }
  // Rank 2 dials rank 1, whose listener is gone: a PeerError naming it, and it stays closed.
  rails[1]->close();
  const std::vector<uint8_t> msg(8, 1);
  EXPECT_THROW(rails[2]->send(1, 1, msg.data(), msg.size(), Deadline::after_seconds(2)), PeerError);
  EXPECT_FALSE(rails[2]->reaches(1));
  try {
    rails[2]->send(1, 2, msg.data(), msg.size(), Deadline::after_seconds(2));
    FAIL() << "expected a PeerError";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 1);
  }
}

TEST(TcpFirstUse, AbortWakesARankWaitingToBeDialed) {
  auto rails = make_mesh(2, first_use_config());
  std::vector<uint8_t> got(8);
  run_ranks(2, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      rails[0]->abort("stop");
      return;
    }
    EXPECT_THROW(rails[0]->recv(1, 1, got.data(), got.size(), Deadline::after_seconds(10)), NezhaError);
  });
}

}  // namespace
}  // namespace nezha::transport
