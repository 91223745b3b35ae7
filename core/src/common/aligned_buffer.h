// AlignedBuffer: an uninitialised heap buffer that starts on a cache line.
//
// Why not std::vector or new[]: glibc serves large blocks with mmap and returns them 16 bytes past a
// page, i.e. 16 bytes off a cache line. Buffers the kernel copies into or out of socket buffers must
// share the payload's cache-line alignment there (transport/frame.h), or each of those copies costs
// 2-3x as much.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace nezha {

constexpr size_t kCacheLineBytes = 64;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes)
      : mem_(bytes == 0 ? nullptr
                        : static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{kCacheLineBytes}))),
        size_(bytes) {}

  uint8_t* data() const { return mem_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{kCacheLineBytes}); }
  };
  std::unique_ptr<uint8_t[], Free> mem_;
  size_t size_ = 0;
};

}  // namespace nezha
