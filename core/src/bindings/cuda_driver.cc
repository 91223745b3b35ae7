#include "bindings/cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <iterator>

#include "common/error.h"

namespace nezha::bindings {
namespace {

constexpr unsigned kHostAllocPortable = 0x01;  // CU_MEMHOSTALLOC_PORTABLE: usable from any context

template <typename Fn>
void load(void* lib, const char* symbol, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (*fn == nullptr)
    throw NezhaError(std::string("nezha.jax CUDA handler: libcuda.so.1 lacks ") + symbol +
                     " (driver too old?)");
}

}  // namespace

const CudaDriver& CudaDriver::get() {
  static std::once_flag once;
  static CudaDriver* driver = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      failure = std::string("nezha.jax CUDA handler: cannot load the CUDA driver libcuda.so.1: ") +
                (why ? why : "unknown error");
      return;
    }
    auto* d = new CudaDriver();  // kept for the process's life, as the library is
    try {
      load(lib, "cuMemcpyDtoHAsync_v2", &d->memcpy_dtoh_async);
      load(lib, "cuMemcpyHtoDAsync_v2", &d->memcpy_htod_async);
      load(lib, "cuStreamSynchronize", &d->stream_synchronize);
      load(lib, "cuStreamGetCtx", &d->stream_get_ctx);
      load(lib, "cuCtxPushCurrent_v2", &d->ctx_push_current);
      load(lib, "cuCtxPopCurrent_v2", &d->ctx_pop_current);
      load(lib, "cuMemHostAlloc", &d->mem_host_alloc);
      load(lib, "cuMemFreeHost", &d->mem_free_host);
      load(lib, "cuGetErrorString", &d->get_error_string);
    } catch (const NezhaError& e) {
      failure = e.what();
      delete d;
      return;
    }
    driver = d;
  });
  if (driver == nullptr) throw NezhaError(failure);
  return *driver;
}

void CudaDriver::check(Result r, const char* what) const {
  if (r == 0) return;
  const char* message = nullptr;
  if (get_error_string(r, &message) != 0 || message == nullptr) message = "unknown error";
  throw NezhaError(std::string("CUDA ") + what + ": " + message + " (error " + std::to_string(r) + ")");
}

StreamContext::StreamContext(const CudaDriver& cuda, CudaDriver::Stream stream) : cuda_(cuda) {
  CudaDriver::Context ctx = nullptr;
  cuda.check(cuda.stream_get_ctx(stream, &ctx), "cuStreamGetCtx on XLA's stream");
  cuda.check(cuda.ctx_push_current(ctx), "cuCtxPushCurrent");
}

StreamContext::~StreamContext() {
  CudaDriver::Context popped = nullptr;
  cuda_.ctx_pop_current(&popped);
}

PinnedStaging& PinnedStaging::get() {
  static PinnedStaging* pool = new PinnedStaging();  // leaked on purpose: no teardown after the driver's
  return *pool;
}

PinnedStaging::Lease PinnedStaging::acquire(const CudaDriver& cuda, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it)  // the smallest that fits
      if (it->second >= bytes) {
        Lease lease(this, it->first, it->second);
        idle_.erase(std::next(it).base());
        return lease;
      }
  }
  void* p = nullptr;
  cuda.check(cuda.mem_host_alloc(&p, bytes, kHostAllocPortable), "cuMemHostAlloc (staging)");
  return Lease(this, p, bytes);
}

void PinnedStaging::give_back(void* p, size_t bytes) {
  void* drop = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.emplace_back(p, bytes);
    std::sort(idle_.begin(), idle_.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    if (idle_.size() > kKept) {
      drop = idle_.back().first;
      idle_.pop_back();
    }
  }
  if (drop != nullptr) CudaDriver::get().mem_free_host(drop);  // portable: any context frees it
}

PinnedStaging::Lease::~Lease() {
  if (p_ != nullptr) pool_->give_back(p_, bytes_);
}

}  // namespace nezha::bindings
