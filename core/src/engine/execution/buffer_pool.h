// Reuses large scratch buffers (fusion buffers, reduce-scatter scratch) across operations: a fresh
// 64 MiB allocation per step costs more in page faults than the copy into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "common/aligned_buffer.h"

namespace nezha::engine {

class BufferPool {
 public:
  class Buffer {
   public:
    Buffer() = default;
    Buffer(BufferPool* pool, AlignedBuffer mem) : pool_(pool), mem_(std::move(mem)) {}
    Buffer(Buffer&&) = default;
    Buffer& operator=(Buffer&&) = default;
    ~Buffer() { if (pool_ && mem_.data()) pool_->give_back(std::move(mem_)); }
    uint8_t* data() const { return mem_.data(); }  // starts on a cache line

   private:
    BufferPool* pool_ = nullptr;
    AlignedBuffer mem_;
  };

  // Keeps at most max_cached free buffers and max_cached_bytes of them (smallest dropped first).
  explicit BufferPool(size_t max_cached = 4, size_t max_cached_bytes = SIZE_MAX)
      : max_cached_(max_cached), max_cached_bytes_(max_cached_bytes) {}
  Buffer acquire(size_t bytes);

 private:
  void give_back(AlignedBuffer mem);
  std::mutex mu_;
  size_t max_cached_;
  size_t max_cached_bytes_;
  size_t cached_bytes_ = 0;
  std::vector<AlignedBuffer> free_;
};

}  // namespace nezha::engine
