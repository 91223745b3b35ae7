// The test rail itself keeps rail.h's promises (the algorithm tests rely on them).
#include "memory_rail.h"

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace nezha::testing {
namespace {

// Five seconds from the call: a deadline made once at start-up has passed by the time a long suite
// reaches these tests.
Deadline soon() { return Deadline::after_seconds(5); }

TEST(MemoryRail, DeliversInOrderPerPair) {
  MemoryWorld world(2);
  for (int i = 0; i < 3; ++i) world.rail(0).send(1, 10 + i, &i, sizeof i, soon());
  for (int i = 0; i < 3; ++i) {
    int got = -1;
    world.rail(1).recv(0, 10 + i, &got, sizeof got, soon());
    EXPECT_EQ(got, i);
  }
  EXPECT_EQ(world.rail(0).counters().bytes_sent, 3 * sizeof(int));
  EXPECT_EQ(world.rail(1).counters().bytes_received, 3 * sizeof(int));
  EXPECT_EQ(world.undelivered(), 0u);
}

TEST(MemoryRail, WrongTagOrSizeIsAProtocolErrorThenTheConnectionIsClosed) {
  MemoryWorld world(3);
  int x = 1;
  world.rail(0).send(1, 5, &x, sizeof x, soon());
  EXPECT_THROW(world.rail(1).recv(0, 6, &x, sizeof x, soon()), ProtocolError);
  EXPECT_THROW(world.rail(1).recv(0, 5, &x, sizeof x, soon()), PeerError);
  EXPECT_THROW(world.rail(0).send(1, 5, &x, sizeof x, soon()), PeerError);

  world.rail(0).send(2, 5, &x, sizeof x, soon());
  EXPECT_THROW(world.rail(2).recv(0, 5, &x, 2 * sizeof x, soon()), ProtocolError);
}

TEST(MemoryRail, RecvTimesOutNamingPeerAndRail) {
  MemoryWorld world(2);
  int x = 0;
  const auto start = Clock::now();
  try {
    world.rail(0).recv(1, 1, &x, sizeof x, Deadline::after_seconds(0.05));
    FAIL() << "recv returned without a message";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("rail mem0"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(45));
}

TEST(MemoryRail, AbortWakesABlockedReceiverAndPoisonsTheRail) {
  MemoryWorld world(2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    world.rail(0).abort("test shutdown");
  });
  int x = 0;
  try {
    world.rail(0).recv(1, 1, &x, sizeof x, Deadline::never());
    ADD_FAILURE() << "recv returned after abort";
  } catch (const PeerError&) {
    ADD_FAILURE() << "abort surfaced as a peer failure";
  } catch (const NezhaError& e) {
    EXPECT_NE(std::string(e.what()).find("test shutdown"), std::string::npos) << e.what();
  }
  aborter.join();
  EXPECT_THROW(world.rail(0).send(1, 1, &x, sizeof x, soon()), NezhaError);
  // The peer sees the aborted rank as a failed peer.
  EXPECT_THROW(world.rail(1).recv(0, 1, &x, sizeof x, soon()), PeerError);
}

TEST(MemoryRail, ZeroByteMessagesAreStillExchanged) {
  MemoryWorld world(2);
  std::thread peer([&] { world.rail(1).sendrecv(0, nullptr, 0, 0, nullptr, 0, 9, soon()); });
  world.rail(0).sendrecv(1, nullptr, 0, 1, nullptr, 0, 9, soon());
  peer.join();
  EXPECT_EQ(world.undelivered(), 0u);
}

}  // namespace
}  // namespace nezha::testing
