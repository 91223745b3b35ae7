// shm_coll::Crew, the helper threads of a shm collective rail's rank: a range is cut into whole
// units covering every byte once and in order, the pieces run on distinct threads at once, small
// ranges stay on the caller, an exception in a helper's piece reaches the caller, and thousands of
// back-to-back splits neither lose nor repeat a piece (ThreadSanitizer checks the hand-offs).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/shm_coll/shm_coll_crew.h"

namespace nezha::transport::shm_coll {
namespace {

TEST(ShmCollCrew, PiecesCoverTheRangeOnceInOrderInWholeUnits) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4096}, size_t{4100}, size_t{1000003}})
    for (size_t pieces : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{7}}) {
      size_t next = 0;
      for (size_t i = 0; i < pieces; ++i) {
        const auto [begin, len] = Crew::piece(bytes, 64, pieces, i);
        if (len == 0) continue;
        EXPECT_EQ(begin, next) << bytes << " bytes, piece " << i << " of " << pieces;
        EXPECT_EQ(begin % 64, 0u);
        if (begin + len < bytes) EXPECT_EQ(len % 64, 0u) << "only the last piece may end off a unit";
        next = begin + len;
      }
      EXPECT_EQ(next, bytes) << bytes << " bytes in " << pieces << " pieces";
    }
}

TEST(ShmCollCrew, ALargeRangeRunsOnEveryThreadAtOnce) {
  Crew crew(3, 1024, 0, "crew-test");
  ASSERT_EQ(crew.threads(), 3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::vector<std::pair<size_t, size_t>> ran;
  std::atomic<int> inside{0}, most{0};
  crew.split(3 << 20, 64, [&](size_t at, size_t len) {
    const int now = ++inside;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others start meanwhile
    --inside;
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    ran.emplace_back(at, len);
  });
  EXPECT_EQ(ids.size(), 3u) << "every thread ran a piece";
  EXPECT_TRUE(ids.count(std::this_thread::get_id())) << "the caller runs a piece too";
  EXPECT_EQ(most.load(), 3) << "the pieces did not run at once";
  std::sort(ran.begin(), ran.end());
  size_t next = 0;
  for (const auto& [at, len] : ran) {
    EXPECT_EQ(at, next);
    next = at + len;
  }
  EXPECT_EQ(next, size_t{3} << 20);
}

TEST(ShmCollCrew, RangesBelowTwoPiecesStayOnTheCaller) {
  Crew crew(4, 4096, 0, "crew-test");
  std::vector<std::thread::id> ids;
  crew.split(8191, 64, [&](size_t at, size_t len) {
    EXPECT_EQ(at, 0u);
    EXPECT_EQ(len, 8191u);
    ids.push_back(std::this_thread::get_id());
  });
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  int calls = 0;
  crew.split(0, 64, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls, 0) << "an empty range runs nothing";
}

TEST(ShmCollCrew, AHelpersExceptionReachesTheCallerAndTheCrewGoesOn) {
  Crew crew(3, 64, 0, "crew-test");
  EXPECT_THROW(crew.split(64 * 3, 64,
                          [&](size_t at, size_t) {
                            if (at > 0) throw std::runtime_error("piece failed");
                          }),
               std::runtime_error);
  std::atomic<size_t> covered{0};
  crew.split(64 * 3, 64, [&](size_t, size_t len) { covered += len; });
  EXPECT_EQ(covered.load(), 64u * 3);
}

TEST(ShmCollCrew, BackToBackSplitsRunEveryPieceExactlyOnce) {
  for (double spin_us : {0.0, 20.0}) {  // helpers that sleep between pieces and helpers that spin
    Crew crew(4, 64, spin_us, "crew-test");
    std::vector<uint8_t> buf(64 * 4 + 17);
    for (int round = 1; round <= 3000; ++round) {
      crew.split(buf.size(), 64, [&](size_t at, size_t len) {
        for (size_t i = at; i < at + len; ++i) buf[i] = static_cast<uint8_t>(buf[i] + 1);
      });
      for (size_t i = 0; i < buf.size(); ++i)
        ASSERT_EQ(buf[i], static_cast<uint8_t>(round)) << "byte " << i << " in round " << round;
    }
  }
}

}  // namespace
}  // namespace nezha::transport::shm_coll
