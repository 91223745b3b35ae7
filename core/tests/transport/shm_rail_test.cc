// ShmRail with ranks as threads of one process: message sizes across the ring's wrap and chunk
// boundaries up to 64 MiB, tag/size mismatches, sendrecv rings of 2-4 ranks with messages larger
// than the ring, abort and deadlines, the same-host rule, foreign segments, reset and reconnect.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/usable_cores.h"
#include "shm_mesh.h"
#include "tcp_mesh.h"
#include "transport/rail_factory.h"
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

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ShmRail, PointToPointSizesAcrossRingAndChunkBoundaries) {
  for (bool direct : {true, false}) {  // messages larger than the ring: read directly or streamed
  SCOPED_TRACE(direct ? "direct" : "streamed");
  ShmRailConfig config = small_ring_config();
  config.direct = direct;
  auto rails = make_shm_mesh(2, config);
  const size_t ring = 64 << 10;
  const std::vector<size_t> sizes{0, 1, 15, 16, 17, 4095, 16 << 10, (16 << 10) + 3, ring - 32, ring - 31,
                                  ring, ring + 1, 3 * ring + 7, (1 << 20) + 13};
  run_ranks(2, [&](int r) {
    const Deadline d = Deadline::after_seconds(20);
    for (size_t m = 0; m < sizes.size(); ++m) {
      if (r == 0) {
        const auto msg = pattern(0, m, sizes[m]);
        rails[0]->send(1, 100 + m, msg.data(), msg.size(), d);
      } else {
        std::vector<uint8_t> got(sizes[m], 0xEE);
        rails[1]->recv(0, 100 + m, got.data(), got.size(), d);
        EXPECT_EQ(first_mismatch(got, 0, m), -1) << "message " << m << " of " << sizes[m] << " bytes";
      }
    }
  });
  EXPECT_EQ(rails[0]->counters().bytes_sent, rails[1]->counters().bytes_received);
  }
}

TEST(ShmRail, SixtyFourMiBThroughTheDefaultRing) {
  ShmRailConfig c;
  c.secret = "s";
  auto rails = make_shm_mesh(2, c);
  const size_t bytes = (64u << 20) + 5;  // not a multiple of the chunk or the ring
  const auto msg = pattern(0, 9, bytes);
  std::vector<uint8_t> got(bytes, 0);
  run_ranks(2, [&](int r) {
    const Deadline d = Deadline::after_seconds(60);
    if (r == 0) rails[0]->send(1, 9, msg.data(), bytes, d);
    else rails[1]->recv(0, 9, got.data(), bytes, d);
  });
  EXPECT_EQ(first_mismatch(got, 0, 9), -1);
  EXPECT_EQ(rails[0]->send_buffer_bytes(), (size_t{1} << 20) - 32);
}

TEST(ShmRail, RingsShrinkWithManyLocalRanksAndStillCarryEveryMessage) {
  // A budget that fits two 1 MiB rings: with 6 ranks (5 peers) each ring is 1 MiB / 5 * 2, whole
  // pages; with 2 ranks the configured ring is kept.
  ShmRailConfig c = small_ring_config();
  c.ring_bytes = 1 << 20;
  c.segment_budget = 2 << 20;
  EXPECT_EQ(make_shm_mesh(2, c)[0]->send_buffer_bytes(), (size_t{1} << 20) - 32);
  const size_t shrunk = (size_t{2} << 20) / 5 / 4096 * 4096;
  auto rails = make_shm_mesh(6, c);
  for (const auto& rail : rails) EXPECT_EQ(rail->send_buffer_bytes(), shrunk - 32);
  c.segment_budget = 4096;  // never below the floor
  EXPECT_EQ(make_shm_mesh(3, c)[2]->send_buffer_bytes(), ShmRail::kMinRingBytes - 32);

  // Every rank sends a message larger than the ring to the next one and receives from the previous.
  const size_t bytes = 3 * shrunk + 11;
  run_ranks(6, [&](int r) {
    const Deadline d = Deadline::after_seconds(20);
    const auto msg = pattern(r, 7, bytes);
    std::vector<uint8_t> got(bytes, 0);
    rails[r]->sendrecv_tags((r + 1) % 6, msg.data(), bytes, 7, (r + 5) % 6, got.data(), bytes, 7, d);
    EXPECT_EQ(first_mismatch(got, (r + 5) % 6, 7), -1) << "rank " << r;
  });
}

TEST(ShmRail, TagOrSizeMismatchIsProtocolErrorAndClosesThePair) {
  for (bool wrong_size : {false, true}) {
    auto rails = make_shm_mesh(2);
    std::string receiver_error, sender_error;
    run_ranks(2, [&](int r) {
      const Deadline d = Deadline::after_seconds(10);
      std::vector<uint8_t> buf(100);
      if (r == 0) {
        rails[0]->send(1, 5, buf.data(), 100, d);
        // The receiver closes the pair: a later send fails once the ring cannot take it.
        sender_error = what_of([&] {
          std::vector<uint8_t> big(1 << 20);
          rails[0]->send(1, 6, big.data(), big.size(), d);
        });
      } else {
        try {
          rails[1]->recv(0, wrong_size ? 5 : 4, buf.data(), wrong_size ? 99 : 100, d);
          ADD_FAILURE() << "mismatched message accepted";
        } catch (const ProtocolError& e) {
          receiver_error = e.what();
        }
        EXPECT_THROW(rails[1]->recv(0, 6, buf.data(), 1, d), PeerError);
      }
    });
    EXPECT_NE(receiver_error.find("rank 0"), std::string::npos) << receiver_error;
    EXPECT_NE(receiver_error.find("shm-test"), std::string::npos) << receiver_error;
    EXPECT_NE(receiver_error.find(wrong_size ? "99 bytes" : "expected tag 4"), std::string::npos) << receiver_error;
    EXPECT_NE(sender_error.find("rank 1"), std::string::npos) << sender_error;
  }
}

TEST(ShmRail, SendrecvRingsLargerThanTheRingNeverDeadlock) {
  for (int n : {2, 3, 4}) for (bool direct : {true, false}) {
    SCOPED_TRACE("ranks " + std::to_string(n) + (direct ? " direct" : " streamed"));
    ShmRailConfig config = small_ring_config();
    config.direct = direct;
    auto rails = make_shm_mesh(n, config);
    const size_t bytes = (1 << 20) + 77;  // 16 rings' worth: both directions must progress together
    run_ranks(n, [&](int r) {
      const Deadline d = Deadline::after_seconds(30);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      for (size_t round = 0; round < 3; ++round) {
        const auto out = pattern(r, round, bytes);
        std::vector<uint8_t> in(bytes);
        rails[r]->sendrecv_tags(next, out.data(), bytes, 40 + round, prev, in.data(), bytes, 40 + round, d);
        EXPECT_EQ(first_mismatch(in, prev, round), -1) << "rank " << r << " round " << round;
      }
      // Both directions with the same peer at once (pairwise exchange).
      if (n == 2) {
        const auto out = pattern(r, 7, bytes);
        std::vector<uint8_t> in(bytes);
        rails[r]->sendrecv(1 - r, out.data(), bytes, 1 - r, in.data(), bytes, 77, d);
        EXPECT_EQ(first_mismatch(in, 1 - r, 7), -1);
      }
    });
  }
}

TEST(ShmRail, AbortWakesABlockedCallAtOnceAndPeersSeePeerError) {
  auto rails = make_shm_mesh(3);
  std::string waiter_error, peer_error;
  double waited = 0;
  run_ranks(3, [&](int r) {
    const Deadline d = Deadline::after_seconds(30);
    std::vector<uint8_t> buf(16);
    if (r == 0) {
      const auto t = Clock::now();
      waiter_error = what_of([&] { rails[0]->recv(1, 1, buf.data(), 16, d); });
      waited = seconds_since(t);
    } else if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      rails[0]->abort("test abort");
    } else {
      try {
        rails[2]->recv(0, 1, buf.data(), 16, d);
      } catch (const PeerError& e) {
        peer_error = e.what();
      }
    }
  });
  EXPECT_NE(waiter_error.find("test abort"), std::string::npos) << waiter_error;
  EXPECT_LT(waited, 1.0);
  EXPECT_NE(peer_error.find("rank 0"), std::string::npos) << peer_error;
  EXPECT_THROW(rails[0]->send(1, 2, nullptr, 0, Deadline::after_seconds(1)), NezhaError);
}

TEST(ShmRail, DeadlineIsTimeoutErrorNamingPeerAndRail) {
  auto rails = make_shm_mesh(2);
  std::vector<uint8_t> buf(8);
  const auto t = Clock::now();
  try {
    rails[0]->recv(1, 3, buf.data(), 8, Deadline::after_seconds(0.3));
    FAIL() << "recv without a sender returned";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("shm-test"), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(t), 0.29);
  EXPECT_LT(seconds_since(t), 2.0);
}

TEST(ShmRail, RanksOnAnotherHostAreUnreachable) {
  // Rank 2 carries another launcher host entry.
  std::vector<std::unique_ptr<ShmRail>> rails;
  for (int r = 0; r < 3; ++r) {
    ShmRailConfig c = small_ring_config();
    c.host_id = r == 2 ? "node-b" : "node-a";
    rails.push_back(std::make_unique<ShmRail>(c, r, 3));
  }
  const auto addrs = testing::addresses_of(rails);
  run_ranks(3, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  EXPECT_TRUE(rails[0]->reaches(1));
  EXPECT_FALSE(rails[0]->reaches(2));
  EXPECT_FALSE(rails[2]->reaches(0));
  std::vector<uint8_t> buf(4);
  const std::string err = what_of([&] { rails[0]->send(2, 1, buf.data(), 4, Deadline::after_seconds(1)); });
  EXPECT_NE(err.find("rank 2"), std::string::npos) << err;
  EXPECT_NE(err.find("host entry"), std::string::npos) << err;
  EXPECT_THROW(rails[2]->recv(1, 1, buf.data(), 4, Deadline::after_seconds(1)), InvalidArgument);
  run_ranks(2, [&](int r) {  // the two ranks of node-a still talk
    const Deadline d = Deadline::after_seconds(10);
    if (r == 0) rails[0]->send(1, 8, "abcd", 4, d);
    else {
      rails[1]->recv(0, 8, buf.data(), 4, d);
      EXPECT_EQ(std::memcmp(buf.data(), "abcd", 4), 0);
    }
  });
}

TEST(ShmRail, AnotherBootIdOrNetworkNamespaceIsAnotherHost) {
  for (int field : {0, 1}) {
    std::vector<std::unique_ptr<ShmRail>> rails;
    for (int r = 0; r < 2; ++r) rails.push_back(std::make_unique<ShmRail>(small_ring_config(), r, 2));
    auto addrs = testing::addresses_of(rails);
    // Each rank sees the other as if it had booted elsewhere / lived in another namespace.
    for (auto& a : addrs) {
      shm::ShmAddress parsed = shm::decode_address(a, "test");
      if (field == 0) parsed.boot_id = "00000000-0000-0000-0000-000000000000";
      else parsed.netns_inode += 1;
      a = shm::encode_address(parsed);
    }
    run_ranks(2, [&](int r) {
      std::vector<std::string> view = addrs;
      view[r] = rails[r]->local_address();
      rails[r]->connect(view, Deadline::after_seconds(5));
    });
    EXPECT_FALSE(rails[0]->reaches(1));
    const std::string err = what_of([&] { rails[0]->send(1, 1, "x", 1, Deadline::after_seconds(1)); });
    EXPECT_NE(err.find(field == 0 ? "boot id" : "network namespace"), std::string::npos) << err;
  }
}

TEST(ShmRail, SegmentOfAnotherJobIsRefused) {
  // Rank 1 runs with another job secret: its segment's job tag does not match rank 0's job. The
  // pair's first data call finds out, on either end.
  ShmRailConfig a = small_ring_config("job-a"), b = small_ring_config("job-b");
  ShmRail r0(a, 0, 2), r1(b, 1, 2);
  const std::vector<std::string> addrs{r0.local_address(), r1.local_address()};
  r0.connect(addrs, Deadline::after_seconds(5));
  r1.connect(addrs, Deadline::after_seconds(5));
  std::vector<uint8_t> buf(8);
  std::string err0, err1;
  try {
    r0.send(1, 1, buf.data(), buf.size(), Deadline::after_seconds(5));
  } catch (const ProtocolError& e) {
    err0 = e.what();
  }
  try {
    r1.recv(0, 1, buf.data(), buf.size(), Deadline::after_seconds(5));
  } catch (const ProtocolError& e) {
    err1 = e.what();
  }
  EXPECT_NE(err0.find("another job"), std::string::npos) << err0;
  EXPECT_NE(err0.find("rank 1"), std::string::npos) << err0;
  EXPECT_NE(err1.find("another job"), std::string::npos) << err1;
  EXPECT_NE(err1.find("rank 0"), std::string::npos) << err1;
  EXPECT_FALSE(r0.reaches(1));
}

TEST(ShmSegment, HeaderChecksRefuseStaleOrForeignSegments) {
  shm::SegmentIdentity id{std::string(16, 'j'), std::string(16, 'n'), 1234, 99, 2, 3, 8192};
  shm::Segment s = shm::Segment::create(id);
  const size_t bytes = shm::segment_bytes_for(3, 8192);
  EXPECT_EQ(shm::header_mismatch(*s.header(), bytes, id), "");
  auto expect_refused = [&](shm::SegmentIdentity other, const char* why) {
    EXPECT_NE(shm::header_mismatch(*s.header(), shm::segment_bytes_for(other.slots, other.ring_bytes), other).find(why),
              std::string::npos)
        << why;
  };
  auto other = id;
  other.job_tag = std::string(16, 'x');
  expect_refused(other, "another job");
  other = id;
  other.nonce = std::string(16, 'x');
  expect_refused(other, "nonce");
  other = id;
  other.creator_pid = 4321;  // a stale segment of an earlier process with the same name
  expect_refused(other, "created by pid 1234");
  other = id;
  other.creator_start_time = 100;  // same pid, reused by a later process
  expect_refused(other, "created by pid");
  other = id;
  other.owner_rank = 1;
  expect_refused(other, "rank 2");
  other = id;
  other.ring_bytes = 4096;
  expect_refused(other, "layout");
  EXPECT_NE(shm::header_mismatch(*s.header(), bytes - 4096, id).find("size"), std::string::npos);
  s.header()->magic = 1;
  EXPECT_NE(shm::header_mismatch(*s.header(), bytes, id).find("magic"), std::string::npos);
  s.header()->magic = shm::kSegmentMagic;
  s.header()->version = 7;
  EXPECT_NE(shm::header_mismatch(*s.header(), bytes, id).find("version"), std::string::npos);
}

TEST(ShmSegment, ATrailerFollowsTheRingsAndIsPartOfTheIdentity) {
  shm::SegmentIdentity id{std::string(16, 'j'), std::string(16, 'n'), 1234, 99, 0, 3, 8192, 10000};
  shm::Segment s = shm::Segment::create(id);
  ASSERT_NE(s.trailer(), nullptr);
  EXPECT_EQ(s.trailer_bytes(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.trailer()) % 4096, 0u);
  const size_t bytes = shm::segment_bytes_for(3, 8192, 10000);
  // Past the last ring, within the mapping, and zero (a host board starts so).
  EXPECT_GE(s.trailer(), s.ring_data(2) + 8192);
  EXPECT_LE(s.trailer() + 10000, reinterpret_cast<uint8_t*>(s.header()) + bytes);
  for (size_t i = 0; i < 10000; i += 997) EXPECT_EQ(s.trailer()[i], 0) << i;
  EXPECT_EQ(shm::header_mismatch(*s.header(), bytes, id), "");
  auto other = id;
  other.trailer_bytes = 0;  // a peer that expects no board
  EXPECT_NE(shm::header_mismatch(*s.header(), bytes, other).find("trailer"), std::string::npos);
  shm::SegmentIdentity plain{std::string(16, 'j'), std::string(16, 'n'), 1234, 99, 1, 3, 8192};
  EXPECT_EQ(shm::Segment::create(plain).trailer(), nullptr);
}

TEST(ShmRail, ResetThenConnectFormsAFreshRail) {
  auto rails = make_shm_mesh(2);
  std::vector<uint8_t> buf(32);
  run_ranks(2, [&](int r) {  // break the pair with a mismatch
    const Deadline d = Deadline::after_seconds(5);
    if (r == 0) rails[0]->send(1, 1, buf.data(), 32, d);
    else EXPECT_THROW(rails[1]->recv(0, 2, buf.data(), 32, d), ProtocolError);
  });
  rails[0]->abort("before reset");
  for (auto& rail : rails) rail->reset();
  const auto addrs = testing::addresses_of(rails);
  run_ranks(2, [&](int r) {
    const Deadline d = Deadline::after_seconds(10);
    rails[r]->connect(addrs, d);
    const auto out = pattern(r, 3, 100000);
    std::vector<uint8_t> in(100000);
    rails[r]->sendrecv(1 - r, out.data(), out.size(), 1 - r, in.data(), in.size(), 9, d);
    EXPECT_EQ(first_mismatch(in, 1 - r, 3), -1);
  });
}

TEST(ShmRail, BadCallsAreInvalidArgument) {
  ShmRail unconnected(small_ring_config(), 0, 2);
  EXPECT_THROW(unconnected.send(1, 1, "x", 1, Deadline::after_seconds(1)), NezhaError);
  EXPECT_THROW(unconnected.send(0, 1, "x", 1, Deadline::after_seconds(1)), InvalidArgument);
  EXPECT_THROW(unconnected.send(5, 1, "x", 1, Deadline::after_seconds(1)), InvalidArgument);
  EXPECT_THROW(ShmRail(small_ring_config(), 2, 2), InvalidArgument);
  EXPECT_THROW(unconnected.connect({"garbage", "garbage"}, Deadline::after_seconds(1)), InvalidArgument);
  EXPECT_THROW(unconnected.connect({unconnected.local_address()}, Deadline::after_seconds(1)), InvalidArgument);
}

TEST(ShmRail, NobodySpinsWhereThisHostsRanksOutnumberTheCores) {
  RailSpec spec;
  spec.kind = "shm";
  RailContext ctx;
  ctx.secret = "s";
  auto spin_of = [&](int size, int local_size) {
    ctx.size = size;
    ctx.local_size = local_size;
    auto rail = make_rail(spec, ctx);
    auto* shm = dynamic_cast<ShmRail*>(rail.get());
    EXPECT_NE(shm, nullptr);
    return shm ? shm->config().spin_us : -1.0;
  };
  const double spin = ShmRailConfig().spin_us;
  const int cores = usable_cores();
  EXPECT_EQ(spin_of(cores, 0), spin);
  EXPECT_EQ(spin_of(4 * cores, 2), spin);  // many ranks, few on this host
  EXPECT_EQ(spin_of(cores + 1, 0), 0);
  EXPECT_EQ(spin_of(4 * cores, cores + 1), 0);
  spec.options = {{"spin_us", "5"}};
  EXPECT_EQ(spin_of(cores + 1, 0), 5);
}

}  // namespace
}  // namespace nezha::transport
