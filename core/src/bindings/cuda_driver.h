// The few CUDA driver API calls nezha.jax's CUDA FFI handler needs, loaded with dlopen on first use.
//
// Why the driver API, dlopen'ed: nezha._core builds and imports on machines without CUDA (CI has no
// GPU), and the driver library libcuda.so.1 is wherever an NVIDIA driver is, whatever CUDA runtime
// jaxlib's plugin ships. The handler only runs where jax compiled for CUDA, so the driver is there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace nezha::bindings {

class CudaDriver {
 public:
  using Result = int;        // CUresult
  using Stream = void*;      // CUstream (== cudaStream_t)
  using Context = void*;     // CUcontext
  using DevicePtr = uint64_t;  // CUdeviceptr

  // The loaded driver; throws NezhaError naming libcuda.so.1 and the missing symbol otherwise.
  static const CudaDriver& get();

  // Throws NezhaError "CUDA <what>: <driver's message>" unless `r` is CUDA_SUCCESS.
  void check(Result r, const char* what) const;

  Result (*memcpy_dtoh_async)(void* dst, DevicePtr src, size_t bytes, Stream s) = nullptr;
  Result (*memcpy_htod_async)(DevicePtr dst, const void* src, size_t bytes, Stream s) = nullptr;
  Result (*stream_synchronize)(Stream s) = nullptr;
  Result (*stream_get_ctx)(Stream s, Context* ctx) = nullptr;
  Result (*ctx_push_current)(Context ctx) = nullptr;
  Result (*ctx_pop_current)(Context* ctx) = nullptr;
  Result (*mem_host_alloc)(void** p, size_t bytes, unsigned flags) = nullptr;
  Result (*mem_free_host)(void* p) = nullptr;
  Result (*get_error_string)(Result r, const char** s) = nullptr;

 private:
  CudaDriver() = default;
};

// Makes the context of `stream` current on this thread for the scope (XLA usually has it current
// already; pushing it again is cheap and makes the handler independent of that).
class StreamContext {
 public:
  StreamContext(const CudaDriver& cuda, CudaDriver::Stream stream);
  ~StreamContext();
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

 private:
  const CudaDriver& cuda_;
};

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
