// The host board: shared memory in which the ranks of a one-host job agree on a small allreduce and
// exchange its inputs at once, without rank 0 (host_vote.h says when it is used).
//
// Why: on one host the coordinator's round trip is the whole cost of a small allreduce, and it
// grows with the job: rank 0 reads n - 1 requests and writes n - 1 responses per operation, and
// every rank encodes and decodes a message, wakes and is woken (4 ranks on 2 cores: ~110 us for 8
// bytes; 32 ranks: ~1.4 ms). A barrier through one shared word costs 28 us at 4 ranks and 66 us at
// 32 on the same cores (benchmarks/SHM.md). So each rank writes its input beside the others' and
// counts itself in; the last one in wakes the rest, and every rank reduces the n inputs itself, in
// rank order, with the same code: the bits are the same everywhere.
//
// Layout (rank 0's control segment's trailer, transport/shm/shm_message_path.h; the geometry is
// fixed so that every rank computes the segment's size alike): a header line with `ready`, then per
// slot one line holding its word, then per slot two parities x size areas of kAreaBytes (the k-th
// vote of a slot uses parity k % 2: a rank can start vote k + 1 while a slower one still reads k,
// and none can start k + 2 before every rank has counted itself into k + 1, so after it read k).
//
// The slot word: bit 31 broken, bits 0-30 the arrivals ever counted (mod 2^31). The k-th vote
// (k from 0) is complete once arrivals reach size x (k + 1). Every change is a compare-and-swap on
// that word, so a break and the last arrival are ordered: once broken nothing arrives, and a vote
// is complete for every rank or for none (ranks that see it broken and incomplete all take another
// path; host_vote.h). Waiters sleep on the word (a process-shared futex) in bounded slices.
//
// An area: the vote number + 1 it carries (so fresh zero memory carries none), a flag for "this
// rank does not vote this time" (then every rank takes negotiation's path), the input's size and
// the input.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nezha::engine {

class HostVoteBoard {
 public:
  static constexpr uint32_t kSlots = 64;        // small allreduces a job can vote on
  static constexpr size_t kMaxInputBytes = 64;  // one rank's input
  static constexpr size_t kAreaBytes = 128;

  // The board's size for a job of `size` ranks (the segment trailer rank 0's path offers).
  static size_t bytes_for(int size);

  HostVoteBoard() = default;
  // Over `bytes` of shared memory at `base` (zero-filled before any rank uses it). Throws
  // InvalidArgument when it is smaller than bytes_for(size).
  HostVoteBoard(uint8_t* base, size_t bytes, int rank, int size);
  bool valid() const { return base_ != nullptr; }

  // Rank 0, before it answers any request: the board may be used (every rank maps it).
  void set_ready();
  bool ready() const;

  enum class State { kPending, kComplete, kBroken };

  // Puts this rank's input (or, `divert`, the mark that it does not vote) for vote `seq` of `slot`
  // in its area, then counts it in; the last one in wakes the waiters. kBroken: the slot was broken
  // first, nothing was counted. bytes <= kMaxInputBytes.
  State arrive(uint32_t slot, uint64_t seq, const void* input, size_t bytes, bool divert);
  State state(uint32_t slot, uint64_t seq) const;
  // Sleeps until vote `seq` of `slot` is no longer pending, at most timeout_s.
  State wait(uint32_t slot, uint64_t seq, double timeout_s) const;

  // Once complete: whether some rank marked it diverted; rank r's input (nullptr unless it carries
  // this vote) and its size.
  bool any_diverted(uint32_t slot, uint64_t seq) const;
  const uint8_t* input(uint32_t slot, uint64_t seq, int r, size_t* bytes) const;
  // The ranks that have not counted themselves into vote `seq` (for a stall's message).
  std::vector<int> missing(uint32_t slot, uint64_t seq) const;

  // No vote completes after this on any slot (those complete stay so); wakes every waiter.
  void break_all();

 private:
  struct Area;
  std::atomic<uint32_t>& word(uint32_t slot) const;
  Area& area(uint32_t slot, uint64_t seq, int r) const;
  uint32_t target(uint64_t seq) const;
  State state_of(uint32_t word, uint64_t seq) const;

  uint8_t* base_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace nezha::engine
