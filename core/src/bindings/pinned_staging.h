// Pinned host staging for nezha.jax's CUDA FFI handler (bindings/jax_ffi_cuda.cc), over the
// dlopen'ed driver (common/cuda_driver.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "common/cuda_driver.h"

namespace nezha::bindings {

// Page-locked host memory the handler stages device buffers through (device<->host copies at full
// PCIe speed, no driver-side bounce). Allocating it costs milliseconds, so buffers are kept for reuse:
// at most kKept idle ones, the largest first. Thread-safe.
class PinnedStaging {
 public:
  class Lease {
   public:
    Lease(PinnedStaging* pool, void* p, size_t bytes) : pool_(pool), p_(p), bytes_(bytes) {}
    Lease(Lease&& o) noexcept : pool_(o.pool_), p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
    Lease(const Lease&) = delete;
    ~Lease();
    uint8_t* data() const { return static_cast<uint8_t*>(p_); }
    // The engine may still hold the memory (an operation past the backstop): never reuse or free it.
    void abandon() { p_ = nullptr; }

   private:
    PinnedStaging* pool_;
    void* p_;
    size_t bytes_;
  };

  static PinnedStaging& get();
  // Needs the CUDA context current (StreamContext).
  Lease acquire(const CudaDriver& cuda, size_t bytes);

 private:
  static constexpr size_t kKept = 2;
  void give_back(void* p, size_t bytes);

  std::mutex mu_;
  std::vector<std::pair<void*, size_t>> idle_;
};

}  // namespace nezha::bindings
