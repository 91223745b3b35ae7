#include "engine/output_pool.h"

#include <algorithm>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
// An idle block is poisoned, so a result used after it was given back is reported as it would be
// had it been freed.
#define NEZHA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define NEZHA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define NEZHA_POISON(p, n) ((void)(p), (void)(n))
#define NEZHA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace nezha::engine {

OutputPool& OutputPool::get() {
  static OutputPool* pool = new OutputPool;  // never destroyed: results may be freed at exit
  return *pool;
}

void* OutputPool::take(size_t bytes) {
  const size_t block = block_bytes(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(block);
    if (it != idle_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) idle_.erase(it);
      idle_bytes_ -= block;
      ++counters_.reused;
      NEZHA_UNPOISON(p, block);
      return p;
    }
    ++counters_.allocated;
  }
  return ::operator new(block);
}

void OutputPool::give(void* p, size_t bytes) {
  if (!p) return;
  const size_t block = block_bytes(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t cap = caps_.empty() ? 0 : *std::max_element(caps_.begin(), caps_.end());
    if (idle_bytes_ + block <= cap) {
      NEZHA_POISON(p, block);
      idle_[block].push_back(p);
      idle_bytes_ += block;
      return;
    }
  }
  ::operator delete(p);
}

void OutputPool::attach(size_t cap_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  caps_.push_back(cap_bytes);
}

void OutputPool::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!caps_.empty()) caps_.pop_back();
  if (caps_.empty()) free_idle_locked();
}

void OutputPool::free_idle_locked() {
  for (auto& [block, blocks] : idle_)
    for (void* p : blocks) {
      NEZHA_UNPOISON(p, block);
      ::operator delete(p);
    }
  idle_.clear();
  idle_bytes_ = 0;
}

OutputPool::Stats OutputPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = counters_;
  s.idle_bytes = idle_bytes_;
  for (const auto& [block, blocks] : idle_) s.idle_blocks += blocks.size();
  return s;
}

}  // namespace nezha::engine
