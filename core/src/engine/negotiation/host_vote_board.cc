#include "engine/negotiation/host_vote_board.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>

#include "common/error.h"

namespace nezha::engine {
namespace {

constexpr uint32_t kBroken = 1u << 31;
constexpr uint32_t kCountMask = kBroken - 1;
constexpr size_t kLine = 64;

struct Header {
  std::atomic<uint32_t> ready;
};

long futex(const std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Process-shared (no FUTEX_PRIVATE_FLAG): the ranks are processes mapping one memfd.
  return ::syscall(SYS_futex, const_cast<std::atomic<uint32_t>*>(word), op, value, timeout, nullptr, 0);
}

void wake_all(const std::atomic<uint32_t>& word) { futex(&word, FUTEX_WAKE, INT_MAX, nullptr); }

}  // namespace

struct HostVoteBoard::Area {
  std::atomic<uint64_t> tag;  // vote number + 1 this area carries
  uint32_t diverted;
  uint32_t bytes;
  uint8_t input[kMaxInputBytes];
};

size_t HostVoteBoard::bytes_for(int size) {
  return kLine + kSlots * kLine + size_t{kSlots} * 2 * static_cast<size_t>(size) * kAreaBytes;
}

HostVoteBoard::HostVoteBoard(uint8_t* base, size_t bytes, int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) throw InvalidArgument("host board: rank out of range");
  if (base == nullptr || bytes < bytes_for(size))
    throw InvalidArgument("host board: " + std::to_string(bytes) + " bytes, " + std::to_string(bytes_for(size)) +
                          " needed for " + std::to_string(size) + " ranks");
  static_assert(sizeof(Area) <= kAreaBytes);
  if (reinterpret_cast<uintptr_t>(base) % kLine != 0) throw InvalidArgument("host board: not cache-line aligned");
  base_ = base;
}

void HostVoteBoard::set_ready() { reinterpret_cast<Header*>(base_)->ready.store(1, std::memory_order_release); }

bool HostVoteBoard::ready() const {
  return valid() && reinterpret_cast<const Header*>(base_)->ready.load(std::memory_order_acquire) == 1;
}

std::atomic<uint32_t>& HostVoteBoard::word(uint32_t slot) const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(base_ + kLine + size_t{slot} * kLine);
}

HostVoteBoard::Area& HostVoteBoard::area(uint32_t slot, uint64_t seq, int r) const {
  const size_t index = (size_t{slot} * 2 + seq % 2) * static_cast<size_t>(size_) + static_cast<size_t>(r);
  return *reinterpret_cast<Area*>(base_ + kLine + kSlots * kLine + index * kAreaBytes);
}

uint32_t HostVoteBoard::target(uint64_t seq) const {
  return static_cast<uint32_t>((static_cast<uint64_t>(size_) * (seq + 1)) & kCountMask);
}

HostVoteBoard::State HostVoteBoard::state_of(uint32_t w, uint64_t seq) const {
  // Arrivals are at most size x (k + 2) - 1 while anyone is at vote k, so "reached the target" is a
  // difference below half the counter's range.
  const uint32_t ahead = ((w & kCountMask) - target(seq)) & kCountMask;
  if (ahead < (kCountMask >> 1)) return State::kComplete;
  return (w & kBroken) ? State::kBroken : State::kPending;
}

HostVoteBoard::State HostVoteBoard::arrive(uint32_t slot, uint64_t seq, const void* input, size_t bytes,
                                           bool divert) {
  if (slot >= kSlots || bytes > kMaxInputBytes) throw InvalidArgument("host board: slot or input out of range");
  std::atomic<uint32_t>& w = word(slot);
  uint32_t cur = w.load(std::memory_order_acquire);
  if (cur & kBroken) return State::kBroken;
  Area& a = area(slot, seq, rank_);
  a.diverted = divert ? 1 : 0;
  a.bytes = static_cast<uint32_t>(bytes);
  if (bytes > 0) std::memcpy(a.input, input, bytes);
  a.tag.store(seq + 1, std::memory_order_release);
  // Release: the area is visible to whoever sees the count (every later change is a read-modify-
  // write of this word, so it stays in this store's release sequence).
  while (!w.compare_exchange_weak(cur, ((cur & kCountMask) + 1) & kCountMask, std::memory_order_acq_rel,
                                  std::memory_order_acquire)) {
    if (cur & kBroken) return State::kBroken;
  }
  const uint32_t now = ((cur & kCountMask) + 1) & kCountMask;
  if (now == target(seq)) wake_all(w);
  return state_of(now, seq);
}

HostVoteBoard::State HostVoteBoard::state(uint32_t slot, uint64_t seq) const {
  return state_of(word(slot).load(std::memory_order_acquire), seq);
}

HostVoteBoard::State HostVoteBoard::wait(uint32_t slot, uint64_t seq, double timeout_s) const {
  const std::atomic<uint32_t>& w = word(slot);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const uint32_t cur = w.load(std::memory_order_acquire);
    const State s = state_of(cur, seq);
    if (s != State::kPending) return s;
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return s;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    futex(&w, FUTEX_WAIT, cur, &ts);  // EAGAIN (changed), EINTR, ETIMEDOUT: look again
  }
}

bool HostVoteBoard::any_diverted(uint32_t slot, uint64_t seq) const {
  for (int r = 0; r < size_; ++r)
    if (area(slot, seq, r).diverted) return true;
  return false;
}

const uint8_t* HostVoteBoard::input(uint32_t slot, uint64_t seq, int r, size_t* bytes) const {
  Area& a = area(slot, seq, r);
  if (a.tag.load(std::memory_order_acquire) != seq + 1 || a.diverted) return nullptr;
  *bytes = a.bytes;
  return a.input;
}

std::vector<int> HostVoteBoard::missing(uint32_t slot, uint64_t seq) const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r)
    if (area(slot, seq, r).tag.load(std::memory_order_relaxed) != seq + 1) out.push_back(r);
  return out;
}

void HostVoteBoard::break_all() {
  if (!valid()) return;
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    std::atomic<uint32_t>& w = word(slot);
    w.fetch_or(kBroken, std::memory_order_acq_rel);
    wake_all(w);
  }
}

}  // namespace nezha::engine
