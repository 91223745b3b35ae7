#include "transport/shm_coll/shm_coll_crew.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "common/thread_name.h"
#include "transport/shm/shm_ring.h"

namespace nezha::transport::shm_coll {
namespace {

// Process-private futex, no timeout: a helper sleeps until the next piece or the crew's end.
void sleep_while(std::atomic<uint32_t>* word, uint32_t value) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}
void wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Spins up to spin_us while `word` holds `value`; true if it changed meanwhile.
bool spin_while(const std::atomic<uint32_t>& word, uint32_t value, double spin_us) {
  if (spin_us <= 0) return word.load(std::memory_order_acquire) != value;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(spin_us);
  do {
    for (int i = 0; i < 64; ++i) {
      if (word.load(std::memory_order_acquire) != value) return true;
      shm::cpu_relax();
    }
  } while (std::chrono::steady_clock::now() < end);
  return word.load(std::memory_order_acquire) != value;
}

}  // namespace

Crew::Crew(int threads, size_t min_piece_bytes, double spin_us, const std::string& name)
    : min_piece_bytes_(std::max<size_t>(1, min_piece_bytes)), spin_us_(spin_us) {
  for (int i = 1; i < threads; ++i)
    helpers_.emplace_back([this, i, thread_name = name + "-" + std::to_string(i)] {
      name_this_thread(thread_name.c_str());
      helper(static_cast<size_t>(i));
    });
}

Crew::~Crew() {
  stopping_.store(true);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  wake_all(&generation_);
  for (auto& t : helpers_) t.join();
}

std::pair<size_t, size_t> Crew::piece(size_t bytes, size_t align, size_t pieces, size_t i) {
  align = std::max<size_t>(1, align);
  const size_t units = (bytes + align - 1) / align;
  const size_t per = (units + pieces - 1) / pieces;
  const size_t begin = std::min(bytes, per * i * align);
  return {begin, std::min(bytes, begin + per * align) - begin};
}

size_t Crew::pieces_for(size_t bytes, size_t align) const {
  if (helpers_.empty()) return 1;
  const size_t by_size = bytes / std::max(min_piece_bytes_, std::max<size_t>(1, align));
  return std::clamp<size_t>(by_size, 1, helpers_.size() + 1);
}

void Crew::run_piece(size_t index) noexcept {
  if (index >= pieces_) return;
  const auto [begin, len] = piece(bytes_, align_, pieces_, index);
  if (len == 0) return;
  try {
    call_(fn_, begin, len);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void Crew::run(size_t bytes, size_t align, size_t pieces, void* fn, Trampoline call) {
  bytes_ = bytes;
  align_ = align;
  pieces_ = pieces;
  fn_ = fn;
  call_ = call;
  error_ = nullptr;
  // Every helper takes part in every generation (those past `pieces` only count down): one counter.
  pending_.store(static_cast<uint32_t>(helpers_.size()), std::memory_order_relaxed);
  // seq_cst with the sleepers' count (Dekker): a helper about to sleep either sees the new
  // generation or is counted here, so the system call is made only for helpers that sleep.
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes the job above
  if (helpers_asleep_.load(std::memory_order_seq_cst) > 0) wake_all(&generation_);
  run_piece(0);
  for (uint32_t left; (left = pending_.load(std::memory_order_acquire)) != 0;) {
    if (spin_while(pending_, left, spin_us_)) continue;
    caller_asleep_.store(1, std::memory_order_seq_cst);
    if (pending_.load(std::memory_order_seq_cst) == left) sleep_while(&pending_, left);
    caller_asleep_.store(0, std::memory_order_relaxed);
  }
  if (error_) std::rethrow_exception(error_);
}

void Crew::helper(size_t index) {
  // Generation 0 is the crew's start: a helper that begins after the first split was handed out
  // must still take part in it.
  uint32_t seen = 0;
  for (;;) {
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (spin_while(generation_, seen, spin_us_)) break;
      helpers_asleep_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == seen) sleep_while(&generation_, seen);
      helpers_asleep_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    run_piece(index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_asleep_.load(std::memory_order_seq_cst))
      wake_all(&pending_);
  }
}

}  // namespace nezha::transport::shm_coll
