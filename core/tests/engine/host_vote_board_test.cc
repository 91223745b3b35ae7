// The host board's protocol (host_vote_board.h) with ranks as threads over one zeroed buffer:
// every rank gets every rank's input for every vote, in order, through parity reuse and the
// counter's wrap; a diverted vote is seen as such by all; a break stops pending votes and only
// those; missing ranks are named; a board too small is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/error.h"
#include "engine/negotiation/host_vote_board.h"

namespace nezha::engine {
namespace {

using State = HostVoteBoard::State;

struct Memory {
  explicit Memory(int size) : buf(HostVoteBoard::bytes_for(size)) { std::memset(buf.data(), 0, buf.size()); }
  HostVoteBoard board(int rank, int size) { return HostVoteBoard(buf.data(), buf.size(), rank, size); }
  AlignedBuffer buf;
};

void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back(fn, r);
  for (auto& th : t) th.join();
}

// Each rank votes `votes` times starting at vote number `first` on one slot; every rank checks
// every rank's input of every vote (rank * 1000 + vote number, a different size per vote).
void vote_many(Memory& m, int n, uint64_t first, int votes, uint32_t slot) {
  std::atomic<int> bad{0};
  run_threads(n, [&](int r) {
    HostVoteBoard b = m.board(r, n);
    for (int k = 0; k < votes; ++k) {
      const uint64_t seq = first + static_cast<uint64_t>(k);
      const size_t bytes = 8 * (1 + seq % 8);
      std::vector<uint64_t> in(bytes / 8, static_cast<uint64_t>(r) * 1000 + seq);
      State s = b.arrive(slot, seq, in.data(), bytes, false);
      while (s == State::kPending) s = b.wait(slot, seq, 5.0);
      if (s != State::kComplete || b.any_diverted(slot, seq)) {
        ++bad;
        return;
      }
      for (int p = 0; p < n; ++p) {
        size_t got = 0;
        const uint8_t* data = b.input(slot, seq, p, &got);
        uint64_t v = 0;
        if (data) std::memcpy(&v, data + got - 8, 8);
        if (!data || got != bytes || v != static_cast<uint64_t>(p) * 1000 + seq) ++bad;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(HostVoteBoard, EveryRankGetsEveryInputOfEveryVote) {
  Memory m(4);
  vote_many(m, 4, 0, 3000, 0);
  vote_many(m, 4, 0, 50, HostVoteBoard::kSlots - 1);  // slots are independent
}

TEST(HostVoteBoard, MoreRanksThanCores) {
  Memory m(16);
  vote_many(m, 16, 0, 300, 7);
}

TEST(HostVoteBoard, ArrivalCounterWraps) {
  // Start the slot's word where n * first lands just below 2^31, as after ~2^31 / n votes.
  const int n = 4;
  const uint64_t first = (uint64_t{1} << 31) / n - 3;
  Memory m(n);
  auto* word = reinterpret_cast<std::atomic<uint32_t>*>(m.buf.data() + 64 + 5 * 64);
  word->store(static_cast<uint32_t>((n * first) & 0x7fffffffu));
  vote_many(m, n, first, 12, 5);
}

TEST(HostVoteBoard, ADivertedVoteIsSeenByEveryRank) {
  Memory m(3);
  std::atomic<int> diverted{0};
  run_threads(3, [&](int r) {
    HostVoteBoard b = m.board(r, 3);
    for (uint64_t seq = 0; seq < 4; ++seq) {
      const double x = r + 0.5;
      State s = b.arrive(2, seq, &x, sizeof x, /*divert=*/r == 1 && seq == 2);
      while (s == State::kPending) s = b.wait(2, seq, 5.0);
      ASSERT_EQ(s, State::kComplete);
      if (b.any_diverted(2, seq)) {
        EXPECT_EQ(seq, 2u);
        size_t got = 0;
        EXPECT_EQ(b.input(2, seq, 1, &got), nullptr);  // the diverting rank sent no input
        ++diverted;
      }
    }
  });
  EXPECT_EQ(diverted.load(), 3);
}

TEST(HostVoteBoard, BreakStopsPendingVotesOnly) {
  Memory m(3);
  HostVoteBoard b0 = m.board(0, 3), b1 = m.board(1, 3), b2 = m.board(2, 3);
  const int x = 7;
  // Vote 0 completes; vote 1 lacks rank 2.
  ASSERT_EQ(b0.arrive(0, 0, &x, 4, false), State::kPending);
  ASSERT_EQ(b1.arrive(0, 0, &x, 4, false), State::kPending);
  ASSERT_EQ(b2.arrive(0, 0, &x, 4, false), State::kComplete);
  ASSERT_EQ(b0.arrive(0, 1, &x, 4, false), State::kPending);
  ASSERT_EQ(b1.arrive(0, 1, &x, 4, false), State::kPending);
  EXPECT_EQ(b0.missing(0, 1), std::vector<int>{2});
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(b0.wait(0, 1, 10.0), State::kBroken);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b2.break_all();
  waiter.join();
  EXPECT_EQ(b1.state(0, 0), State::kComplete);  // done before the break: stays done
  EXPECT_EQ(b1.state(0, 1), State::kBroken);
  EXPECT_EQ(b2.arrive(0, 1, &x, 4, false), State::kBroken);  // nothing arrives after it
  EXPECT_EQ(b2.arrive(9, 0, &x, 4, false), State::kBroken);  // on any slot
  EXPECT_EQ(b1.wait(0, 1, 0.01), State::kBroken);
}

TEST(HostVoteBoard, WaitEndsAtItsTimeout) {
  Memory m(2);
  HostVoteBoard b = m.board(0, 2);
  const int x = 1;
  ASSERT_EQ(b.arrive(3, 0, &x, 4, false), State::kPending);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(b.wait(3, 0, 0.05), State::kPending);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.04);
  EXPECT_LT(took, 2.0);
}

TEST(HostVoteBoard, ReadyIsRankZerosAndSharedByAll) {
  Memory m(2);
  HostVoteBoard b0 = m.board(0, 2), b1 = m.board(1, 2);
  EXPECT_FALSE(b1.ready());
  b0.set_ready();
  EXPECT_TRUE(b1.ready());
}

TEST(HostVoteBoard, RefusesBadGeometry) {
  Memory m(4);
  EXPECT_THROW(HostVoteBoard(m.buf.data(), m.buf.size(), 0, 5), InvalidArgument);  // sized for 4
  EXPECT_THROW(HostVoteBoard(m.buf.data(), m.buf.size(), 4, 4), InvalidArgument);
  EXPECT_THROW(HostVoteBoard(nullptr, 0, 0, 1), InvalidArgument);
  HostVoteBoard b = m.board(0, 4);
  const char big[HostVoteBoard::kMaxInputBytes + 1] = {};
  EXPECT_THROW(b.arrive(0, 0, big, sizeof big, false), InvalidArgument);
  EXPECT_THROW(b.arrive(HostVoteBoard::kSlots, 0, big, 1, false), InvalidArgument);
}

}  // namespace
}  // namespace nezha::engine
