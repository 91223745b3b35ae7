// The ofi rail over libfabric's tcp;ofi_rxm provider (ofi_mesh.h): exact bytes in both directions for
// sizes around the chunk and window boundaries, size mismatches caught, authentication with the job
// secret, a provider that does not exist, abort, and reset + connect (failover re-admission).
#include <gtest/gtest.h>

#include "common/error.h"
#include "transport/rail_factory.h"

#ifdef NEZHA_WITH_OFI

#include <time.h>

#include <chrono>
#include <thread>

#include "ofi_mesh.h"
#include "tcp_mesh.h"  // pattern helpers

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::make_ofi_mesh;
using testing::make_ofi_rails;
using testing::ofi_addresses;
using testing::ofi_test_config;
using testing::pattern;
using testing::run_ranks;

Deadline generous() { return Deadline::after_seconds(30); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class OfiMesh : public ::testing::TestWithParam<int> {};

TEST_P(OfiMesh, EveryPairExchangesExactBytesAcrossChunkAndWindowBoundaries) {
  const int n = GetParam();
  auto rails = make_ofi_mesh(n);
  const size_t chunk = ofi_test_config().chunk_bytes;
  // 0 bytes, one byte, exactly one chunk, one past, exactly a window, more than two windows.
  const std::vector<size_t> sizes = {0, 1, chunk, chunk + 1, 4 * chunk, 9 * chunk + 123, 1 << 20};
  run_ranks(n, [&](int me) {
    OfiRail& rail = *rails[me];
    for (int step = 1; step < n; ++step) {
      const int to = (me + step) % n, from = (me - step + n) % n;
      for (size_t m = 0; m < sizes.size(); ++m) {
        auto out = pattern(me, m, sizes[m]);
        std::vector<uint8_t> in(sizes[m], 0xAA);
        rail.sendrecv(to, out.data(), out.size(), from, in.data(), in.size(), step * 100 + m, generous());
        EXPECT_EQ(first_mismatch(in, from, m), -1) << "rank " << me << " from " << from << " size " << sizes[m];
      }
    }
  });
  // Plain send/recv, several messages queued to one peer before it receives any (order per pair).
  run_ranks(n, [&](int me) {
    OfiRail& rail = *rails[me];
    if (me == 0) {
      for (int p = 1; p < n; ++p)
        for (size_t m = 0; m < 3; ++m) {
          auto out = pattern(0, m, 1000 * (m + 1) + p);
          rail.send(p, 7, out.data(), out.size(), generous());
        }
    } else {
      for (size_t m = 0; m < 3; ++m) {
        std::vector<uint8_t> in(1000 * (m + 1) + me);
        rail.recv(0, 7, in.data(), in.size(), generous());
        EXPECT_EQ(first_mismatch(in, 0, m), -1) << "rank " << me << " message " << m;
      }
    }
  });
  uint64_t sent = 0, received = 0;
  for (auto& r : rails) sent += r->counters().bytes_sent, received += r->counters().bytes_received;
  EXPECT_EQ(sent, received);
  EXPECT_GT(sent, 0u);
}

INSTANTIATE_TEST_SUITE_P(Ranks, OfiMesh, ::testing::Values(2, 3, 4));

TEST(OfiRail, ASizeMismatchIsAProtocolErrorNamingThePeer) {
  auto rails = make_ofi_mesh(2);
  const size_t chunk = ofi_test_config().chunk_bytes;
  // Same chunk count, different last chunk: a short message.
  std::string error;
  run_ranks(2, [&](int me) {
    std::vector<uint8_t> buf(3 * chunk);
    if (me == 0) {
      // The receiver gives up on this message; a provider that completes a send only once the
      // receiver pulled it (rendezvous) then times the sender out: only the receiver is checked.
      try {
        rails[0]->send(1, 5, buf.data(), 2 * chunk + 10, Deadline::after_seconds(2));
      } catch (const TimeoutError&) {
      }
    } else {
      try {
        rails[1]->recv(0, 5, buf.data(), 2 * chunk + 20, Deadline::after_seconds(10));
      } catch (const ProtocolError& e) {
        error = e.what();
      }
    }
  });
  EXPECT_TRUE(contains(error, "rank 0") && contains(error, "sizes of the two sides differ")) << error;
  EXPECT_FALSE(rails[1]->reaches(0));
  std::vector<uint8_t> buf(8);
  EXPECT_THROW(rails[1]->recv(0, 6, buf.data(), buf.size(), generous()), PeerError);

  // Whole chunks only, one chunk fewer: the "last chunk" bit catches it.
  auto fresh = make_ofi_mesh(2);
  error.clear();
  run_ranks(2, [&](int me) {
    std::vector<uint8_t> data(2 * chunk);
    if (me == 0) {
      // As above: only the receiver's error is checked.
      try {
        fresh[0]->send(1, 9, data.data(), 2 * chunk, Deadline::after_seconds(2));
      } catch (const TimeoutError&) {
      }
    } else {
      try {
        fresh[1]->recv(0, 9, data.data(), chunk, Deadline::after_seconds(10));
      } catch (const ProtocolError& e) {
        error = e.what();
      }
    }
  });
  EXPECT_TRUE(contains(error, "sizes of the two sides differ")) << error;
}

TEST(OfiRail, AWrongSecretIsRefusedAndNamed) {
  auto good = ofi_test_config("right-secret");
  auto bad = ofi_test_config("wrong-secret");
  std::vector<std::unique_ptr<OfiRail>> rails;
  rails.push_back(std::make_unique<OfiRail>(good, 0, 2));
  rails.push_back(std::make_unique<OfiRail>(bad, 1, 2));
  const auto addrs = ofi_addresses(rails);
  std::string errors[2];
  run_ranks(2, [&](int me) {
    try {
      rails[me]->connect(addrs, Deadline::after_seconds(10));
    } catch (const NezhaError& e) {
      errors[me] = e.what();
    }
  });
  for (int me = 0; me < 2; ++me) {
    SCOPED_TRACE(errors[me]);
    EXPECT_TRUE(contains(errors[me], "handshake with rank " + std::to_string(1 - me) + " failed"));
    EXPECT_TRUE(contains(errors[me], "secret")) << "the refusal should say the secret is wrong";
    EXPECT_FALSE(rails[me]->reaches(1 - me));
  }
  std::vector<uint8_t> buf(4);
  EXPECT_THROW(rails[0]->recv(1, 1, buf.data(), buf.size(), generous()), PeerError);
}

TEST(OfiRail, AProviderThatDoesNotExistIsAClearError) {
  auto config = ofi_test_config();
  config.provider = "no-such-provider";
  try {
    OfiRail rail(config, 0, 2);
    FAIL() << "a rail opened a provider that does not exist";
  } catch (const NezhaError& e) {
    EXPECT_TRUE(contains(e.what(), "no usable provider 'no-such-provider'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "tcp")) << "should list the providers there are: " << e.what();
  }
  RailContext ctx;
  ctx.rank = 0;
  ctx.size = 2;
  EXPECT_THROW(make_rail(parse_rail_spec("ofi:carrier-pigeon@127.0.0.1"), ctx), NezhaError);
  EXPECT_THROW(make_rail(parse_rail_spec("ofi:tcp;ofi_rxm@127.0.0.1;colour=blue"), ctx), InvalidArgument);
  EXPECT_THROW(make_rail(parse_rail_spec("ofi:@127.0.0.1"), ctx), InvalidArgument);
}

TEST(OfiRail, TheFactoryBuildsItFromASpecWithASemicolonInTheProvider) {
  const RailSpec spec = parse_rail_spec("ofi:tcp;ofi_rxm@127.0.0.1;window=2;chunk_bytes=8192");
  std::vector<std::unique_ptr<Rail>> rails;
  for (int r = 0; r < 2; ++r) {
    RailContext ctx;
    ctx.rank = r;
    ctx.size = 2;
    ctx.secret = "s";
    rails.push_back(make_rail(spec, ctx));
  }
  EXPECT_EQ(rails[0]->properties().kind, "ofi");
  EXPECT_EQ(rails[0]->properties().name, "tcp;ofi_rxm@127.0.0.1");
  EXPECT_TRUE(contains(rails[0]->properties().local_addr, "@127.0.0.1")) << rails[0]->properties().local_addr;
  const std::vector<std::string> addrs = {rails[0]->local_address(), rails[1]->local_address()};
  run_ranks(2, [&](int me) {
    rails[me]->connect(addrs, generous());
    auto out = pattern(me, 1, 50000);
    std::vector<uint8_t> in(50000);
    rails[me]->as_point_to_point()->sendrecv(1 - me, out.data(), out.size(), 1 - me, in.data(), in.size(), 3,
                                             generous());
    EXPECT_EQ(first_mismatch(in, 1 - me, 1), -1);
  });
}

TEST(OfiRail, AbortWakesAWaitingReceiveAndResetReadmitsTheMesh) {
  auto rails = make_ofi_mesh(3);
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    std::vector<uint8_t> buf(100);
    try {
      rails[0]->recv(1, 1, buf.data(), buf.size(), Deadline::after_seconds(20));
    } catch (const NezhaError& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  rails[0]->abort("test abort");
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(contains(error, "test abort")) << error;
  EXPECT_FALSE(rails[0]->reaches(1));

  // Re-admission: every rank resets, then every rank connects again from the same addresses.
  for (auto& r : rails) r->reset();
  const auto addrs = ofi_addresses(rails);
  run_ranks(3, [&](int me) { rails[me]->connect(addrs, generous()); });
  run_ranks(3, [&](int me) {
    const int to = (me + 1) % 3, from = (me + 2) % 3;
    auto out = pattern(me, 4, 70000);
    std::vector<uint8_t> in(70000);
    rails[me]->sendrecv(to, out.data(), out.size(), from, in.data(), in.size(), 1, generous());
    EXPECT_EQ(first_mismatch(in, from, 4), -1) << "rank " << me;
  });
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

TEST(OfiRail, AWaitingReceiveSleepsInsteadOfSpinning) {
  // Nothing arrives for a second: the waiting thread must sleep on the completion queue's wait
  // object (generous bound: a spinning wait would use the whole second). Not for providers without
  // a wait object (shm), which sleep in 1 ms slices.
  if (ofi_test_config().provider == "shm") GTEST_SKIP() << "shm has no completion wait object";
  auto rails = make_ofi_mesh(2);
  std::vector<uint8_t> buf(64);
  const double before = thread_cpu_seconds();
  EXPECT_THROW(rails[1]->recv(0, 77, buf.data(), buf.size(), Deadline::after_seconds(1.0)), TimeoutError);
  EXPECT_LT(thread_cpu_seconds() - before, 0.3);
}

TEST(OfiRail, ATimeoutNamesThePeerAndClosesIt) {
  auto rails = make_ofi_mesh(2);
  std::vector<uint8_t> buf(64);
  try {
    rails[1]->recv(0, 42, buf.data(), buf.size(), Deadline::after_seconds(0.3));
    FAIL() << "a receive nobody sent to returned";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 0);
    EXPECT_TRUE(contains(e.what(), "rank 0") && contains(e.what(), "timed out")) << e.what();
  }
  EXPECT_FALSE(rails[1]->reaches(0));
}

TEST(OfiRail, ASendWithinItsBufferReturnsBeforeThePeerReceivesAndArrivesWhileTheSenderIdles) {
  // send_buffer_bytes() = window / 2 chunks (2 x 16 KiB here). A message that fits is handed over once
  // its chunks are posted: the send returns although rank 1 posts no receive yet. The chunks are
  // larger than ofi_rxm's eager buffers, so they complete only as rendezvous that the sender's side
  // must progress; rank 0 then never calls into the rail again, so only its progress thread can.
  auto rails = make_ofi_mesh(2);
  if (ofi_test_config().provider == "shm") {
    EXPECT_EQ(rails[0]->send_buffer_bytes(), 0u);  // every send waits for its completion there
    GTEST_SKIP() << "this provider does not buffer sends (shm)";
  }
  ASSERT_EQ(rails[0]->send_buffer_bytes(), size_t{2} * ofi_test_config().chunk_bytes);
  const size_t bytes = rails[0]->send_buffer_bytes() - 1000;
  const auto out = pattern(0, 5, bytes);
  const uint64_t sent_before = rails[0]->counters().bytes_sent;  // the handshake's
  rails[0]->send(1, 9, out.data(), out.size(), Deadline::after_seconds(0.5));  // nobody receives yet
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<uint8_t> in(bytes);
  rails[1]->recv(0, 9, in.data(), in.size(), Deadline::after_seconds(5));
  EXPECT_EQ(first_mismatch(in, 0, 5), -1);
  EXPECT_EQ(rails[0]->counters().bytes_sent - sent_before, bytes);  // counted when handed over

  // A message larger than the buffer is not handed over: with no receiver it times out.
  const auto big = pattern(0, 6, rails[0]->send_buffer_bytes() * 3);
  EXPECT_THROW(rails[0]->send(1, 10, big.data(), big.size(), Deadline::after_seconds(0.3)), TimeoutError);
}

TEST(OfiRail, SendsNobodyReceivedAreDrainedByResetSoTheMeshCanBeReadmitted) {
  // Rank 0 hands over two buffered messages that rank 1 never receives (it "failed over"): they hold
  // every send slot (window = 4 chunks), so without reset()'s drain the handshake of the re-admission
  // could post nothing. Twice, so the second round also meets what is left of the first.
  auto rails = make_ofi_mesh(2);
  if (rails[0]->send_buffer_bytes() == 0) GTEST_SKIP() << "this provider does not buffer sends (shm)";
  const size_t bytes = rails[0]->send_buffer_bytes();
  for (int round = 0; round < 2; ++round) {
    for (uint64_t tag : {1, 2}) {
      const auto out = pattern(0, tag, bytes);
      rails[0]->send(1, tag, out.data(), bytes, Deadline::after_seconds(2));
    }
    run_ranks(2, [&](int me) { rails[me]->reset(); });
    const auto addrs = ofi_addresses(rails);
    run_ranks(2, [&](int me) { rails[me]->connect(addrs, Deadline::after_seconds(10)); });
    run_ranks(2, [&](int me) {
      const auto out = pattern(me, 7, bytes * 3);
      std::vector<uint8_t> in(bytes * 3);
      rails[me]->as_point_to_point()->sendrecv(1 - me, out.data(), out.size(), 1 - me, in.data(), in.size(), 3,
                                             generous());
      EXPECT_EQ(first_mismatch(in, 1 - me, 7), -1) << "rank " << me << " round " << round;
    });
  }
}

TEST(OfiRail, BufferedSendsKeepARingOfMessagesFlowingBothWays) {
  // The ring's pipelined pattern (collectives/ring.cc): send message i+1 while receiving message i,
  // 3 ranks, many messages of one buffer's size; every byte checked.
  auto rails = make_ofi_mesh(3);
  const size_t bytes = rails[0]->send_buffer_bytes();
  if (bytes == 0) GTEST_SKIP() << "this provider does not buffer sends (shm)";
  constexpr int kMessages = 40;
  run_ranks(3, [&](int me) {
    const int next = (me + 1) % 3, prev = (me + 2) % 3;
    std::vector<uint8_t> in(bytes);
    auto message = [&](int rank, int i) { return pattern(rank, static_cast<uint8_t>(i), bytes); };
    auto first = message(me, 0);
    rails[me]->send(next, 1000, first.data(), bytes, generous());
    for (int i = 0; i < kMessages; ++i) {
      if (i + 1 < kMessages) {
        auto ahead = message(me, i + 1);
        rails[me]->sendrecv_tags(next, ahead.data(), bytes, 1000 + i + 1, prev, in.data(), bytes, 1000 + i,
                                 generous());
      } else {
        rails[me]->recv(prev, 1000 + i, in.data(), bytes, generous());
      }
      ASSERT_EQ(first_mismatch(in, prev, static_cast<uint8_t>(i)), -1) << "rank " << me << " message " << i;
    }
  });
}

}  // namespace
}  // namespace nezha::transport

#else  // !NEZHA_WITH_OFI

namespace nezha::transport {
namespace {

TEST(OfiRail, WithoutLibfabricAskingForOneNamesTheMissingLibrary) {
  RailContext ctx;
  try {
    make_rail(parse_rail_spec("ofi:tcp;ofi_rxm@127.0.0.1"), ctx);
    FAIL() << "built an ofi rail without libfabric";
  } catch (const NezhaError& e) {
    EXPECT_NE(std::string(e.what()).find("libfabric"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::transport

#endif
