// Large engine-allocated results (allgather, alltoall, reducescatter outputs) are kept for reuse.
//
// Why: such a result is handed to the caller (a numpy array owning it, TensorFlow copying it out)
// and freed a moment later; the next call of a training loop asks for the same size again. A fresh
// block of hundreds of MB comes from mmap and every page of it is zeroed by the kernel on first
// touch while the peers wait on the rails: on a 256 MB allgather that costs more than gathering it.
// A block given back is kept while an engine lives, up to a cap of idle bytes, and handed out again
// for a request of the same rounded size; with no engine alive nothing idle is kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace nezha::engine {

class OutputPool {
 public:
  // Requests below this come from the ordinary allocator (malloc's own free lists serve them).
  static constexpr size_t kMinPooledBytes = size_t{1} << 20;
  // Pooled blocks are whole multiples of this (a transparent huge page), so a block fits every
  // request that rounds to its size.
  static constexpr size_t kGranuleBytes = size_t{2} << 20;

  // The process's pool: results outlive engines (a caller may hold them), so it is never destroyed.
  static OutputPool& get();

  static size_t block_bytes(size_t bytes) { return (bytes + kGranuleBytes - 1) / kGranuleBytes * kGranuleBytes; }

  // A block of at least `bytes` (>= kMinPooledBytes), uninitialised; an idle one of the same
  // rounded size when there is one. Throws std::bad_alloc as operator new does.
  void* take(size_t bytes);
  // Gives back a block from take(bytes) (the same `bytes`): kept while an engine lives and the idle
  // bytes stay within the cap, else freed.
  void give(void* p, size_t bytes);

  // An engine starts (cap: NEZHA_OUTPUT_CACHE_BYTES, the largest attached cap applies) or stops;
  // when the last one stops, every idle block is freed.
  void attach(size_t cap_bytes);
  void detach();

  // An engine's claim on the pool for its lifetime (attach in start(), detach when destroyed), so an
  // engine whose constructor throws after start() still detaches.
  class Attachment {
   public:
    Attachment() = default;
    Attachment(const Attachment&) = delete;
    Attachment& operator=(const Attachment&) = delete;
    ~Attachment() {
      if (attached_) OutputPool::get().detach();
    }
    void start(size_t cap_bytes) {
      if (attached_) return;
      OutputPool::get().attach(cap_bytes);
      attached_ = true;
    }

   private:
    bool attached_ = false;
  };

  struct Stats {
    uint64_t reused = 0;      // take() served by an idle block
    uint64_t allocated = 0;   // take() that allocated a new block
    size_t idle_bytes = 0;
    size_t idle_blocks = 0;
  };
  Stats stats() const;

 private:
  OutputPool() = default;
  void free_idle_locked();

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> idle_;  // by block size
  size_t idle_bytes_ = 0;
  std::vector<size_t> caps_;  // of the attached engines
  Stats counters_;
};

// std::allocator for results: construct() without a value leaves bytes uninitialised (resize() does
// not zero-fill: every byte of an output is written by its collective), and large blocks come from
// OutputPool.
template <class T>
struct OutputAllocator : std::allocator<T> {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = OutputAllocator<U>;
  };
  OutputAllocator() = default;
  template <class U>
  OutputAllocator(const OutputAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < OutputPool::kMinPooledBytes) return std::allocator<T>::allocate(n);
    return static_cast<T*>(OutputPool::get().take(bytes));
  }
  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < OutputPool::kMinPooledBytes) return std::allocator<T>::deallocate(p, n);
    OutputPool::get().give(p, bytes);
  }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const OutputAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const OutputAllocator<U>&) const noexcept { return false; }
};

}  // namespace nezha::engine
