#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "common/error.h"

namespace nezha {
namespace {

template <typename Fn>
void load(void* lib, const char* symbol, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (*fn == nullptr)
    throw NezhaError(std::string("nezha CUDA: libcuda.so.1 lacks ") + symbol + " (driver too old?)");
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
      failure = std::string("nezha CUDA: cannot load the CUDA driver libcuda.so.1: ") +
                (why ? why : "unknown error");
      return;
    }
    auto* d = new CudaDriver();  // kept for the process's life, as the library is
    try {
      // The _v2 names are what cuda.h's macros resolve to since CUDA 4/11 (the unsuffixed symbols
      // keep the old 32-bit ABIs).
      load(lib, "cuInit", &d->init);
      load(lib, "cuDeviceGetCount", &d->device_get_count);
      load(lib, "cuDeviceGet", &d->device_get);
      load(lib, "cuDeviceGetPCIBusId", &d->device_get_pci_bus_id);
      load(lib, "cuDevicePrimaryCtxRetain", &d->primary_ctx_retain);
      load(lib, "cuDevicePrimaryCtxRelease_v2", &d->primary_ctx_release);
      load(lib, "cuCtxSetCurrent", &d->ctx_set_current);
      load(lib, "cuCtxGetCurrent", &d->ctx_get_current);
      load(lib, "cuCtxGetDevice", &d->ctx_get_device);
      load(lib, "cuCtxPushCurrent_v2", &d->ctx_push_current);
      load(lib, "cuCtxPopCurrent_v2", &d->ctx_pop_current);
      load(lib, "cuStreamCreate", &d->stream_create);
      load(lib, "cuStreamDestroy_v2", &d->stream_destroy);
      load(lib, "cuStreamSynchronize", &d->stream_synchronize);
      load(lib, "cuStreamGetCtx", &d->stream_get_ctx);
      load(lib, "cuMemAlloc_v2", &d->mem_alloc);
      load(lib, "cuMemFree_v2", &d->mem_free);
      load(lib, "cuMemHostAlloc", &d->mem_host_alloc);
      load(lib, "cuMemFreeHost", &d->mem_free_host);
      load(lib, "cuMemcpyDtoHAsync_v2", &d->memcpy_dtoh_async);
      load(lib, "cuMemcpyHtoDAsync_v2", &d->memcpy_htod_async);
      load(lib, "cuMemcpyDtoDAsync_v2", &d->memcpy_dtod_async);
      load(lib, "cuIpcGetMemHandle", &d->ipc_get_mem_handle);
      load(lib, "cuIpcOpenMemHandle_v2", &d->ipc_open_mem_handle);
      load(lib, "cuIpcCloseMemHandle", &d->ipc_close_mem_handle);
      load(lib, "cuModuleLoadData", &d->module_load_data);
      load(lib, "cuModuleUnload", &d->module_unload);
      load(lib, "cuModuleGetFunction", &d->module_get_function);
      load(lib, "cuLaunchKernel", &d->launch_kernel);
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
  cuda.check(cuda.stream_get_ctx(stream, &ctx), "cuStreamGetCtx on the caller's stream");
  cuda.check(cuda.ctx_push_current(ctx), "cuCtxPushCurrent");
}

StreamContext::~StreamContext() {
  CudaDriver::Context popped = nullptr;
  cuda_.ctx_pop_current(&popped);
}

}  // namespace nezha
