// What a TcpRail tells the watchdog about its health: its link (the interface's carrier) and
// whether its connections deliver (nothing unacknowledged for long) while the rail is silent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/error.h"
#include "tcp_mesh.h"

namespace nezha::transport {
namespace {

using std::chrono::milliseconds;
using testing::loopback_config;
using testing::make_mesh;

TEST(TcpRailHealth, LoopbackLinkIsUpAndAnUnconnectedRailVouchesForNothing) {
  TcpRail alone(loopback_config(), 0, 2);
  EXPECT_EQ(alone.link_fault(), "");
  EXPECT_FALSE(alone.delivering(milliseconds(50))) << "no connection: nothing to vouch for";
}

// A peer that stops reading (late, starved of CPU) fills its receive window; everything the sender
// handed to the wire is acknowledged, so the rail still delivers, although the sender is silent.
TEST(TcpRailHealth, ASilentSenderWhosePeerDoesNotReadStillDelivers) {
  auto rails = make_mesh(2);
  EXPECT_TRUE(rails[1]->delivering(milliseconds(50))) << "idle and connected";
  std::vector<uint8_t> big(64 << 20, 0x5A);
  std::atomic<bool> send_ended{false};
  std::thread sender([&] {
    try {
      rails[1]->send(0, 1, big.data(), big.size(), Deadline::after_seconds(10));
    } catch (const std::exception&) {
    }
    send_ended = true;
  });
  const auto counters_before = rails[1]->counters().bytes_sent;
  std::this_thread::sleep_for(milliseconds(400));  // the socket buffers fill, then the send waits
  const auto stuck_at = rails[1]->counters().bytes_sent;
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(send_ended.load()) << "the peer reads nothing: the send cannot have finished";
  EXPECT_EQ(rails[1]->counters().bytes_sent, stuck_at) << "the sender is silent";
  EXPECT_GT(stuck_at, counters_before);
  EXPECT_TRUE(rails[1]->delivering(milliseconds(50))) << "everything sent was acknowledged";
  rails[1]->abort("test over");
  sender.join();
}

}  // namespace
}  // namespace nezha::transport
