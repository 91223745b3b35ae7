// The CUDA driver API calls nezha makes, loaded with dlopen on first use (CudaDriver::get()).
//
// Why the driver API, dlopen'ed: nezha._core builds and imports on machines without CUDA (CI has no
// GPU), and the driver library libcuda.so.1 is wherever an NVIDIA driver is, whatever CUDA runtime
// a framework ships. Users: nezha.jax's CUDA FFI handler (bindings/jax_ffi_cuda.cc) and the CUDA IPC
// lane (core/src/cuda/). No CUDA header is needed: the few types are declared here by layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nezha {

class CudaDriver {
 public:
  using Result = int;          // CUresult
  using Stream = void*;        // CUstream (== cudaStream_t)
  using Context = void*;       // CUcontext
  using Module = void*;        // CUmodule
  using Function = void*;      // CUfunction
  using Device = int;          // CUdevice
  using DevicePtr = uint64_t;  // CUdeviceptr
  struct IpcMemHandle {        // CUipcMemHandle: 64 opaque bytes, passed by value
    char reserved[64];
  };

  static constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
  static constexpr unsigned kStreamNonBlocking = 0x1;        // CU_STREAM_NON_BLOCKING
  static constexpr Result kErrorNoDevice = 100;              // CUDA_ERROR_NO_DEVICE

  // The loaded driver; throws NezhaError naming libcuda.so.1 and the missing symbol otherwise.
  static const CudaDriver& get();

  // Throws NezhaError "CUDA <what>: <driver's message>" unless `r` is CUDA_SUCCESS.
  void check(Result r, const char* what) const;

  // Setup (tests and programs that own their context; the lane uses the caller's).
  Result (*init)(unsigned flags) = nullptr;
  Result (*device_get_count)(int* count) = nullptr;
  Result (*device_get)(Device* dev, int ordinal) = nullptr;
  Result (*device_get_pci_bus_id)(char* id, int len, Device dev) = nullptr;
  Result (*primary_ctx_retain)(Context* ctx, Device dev) = nullptr;
  Result (*primary_ctx_release)(Device dev) = nullptr;
  Result (*ctx_set_current)(Context ctx) = nullptr;
  Result (*ctx_get_current)(Context* ctx) = nullptr;
  Result (*ctx_get_device)(Device* dev) = nullptr;
  Result (*ctx_push_current)(Context ctx) = nullptr;
  Result (*ctx_pop_current)(Context* ctx) = nullptr;
  Result (*stream_create)(Stream* s, unsigned flags) = nullptr;
  Result (*stream_destroy)(Stream s) = nullptr;
  Result (*stream_synchronize)(Stream s) = nullptr;
  Result (*stream_get_ctx)(Stream s, Context* ctx) = nullptr;
  // Memory.
  Result (*mem_alloc)(DevicePtr* p, size_t bytes) = nullptr;
  Result (*mem_free)(DevicePtr p) = nullptr;
  Result (*mem_host_alloc)(void** p, size_t bytes, unsigned flags) = nullptr;
  Result (*mem_free_host)(void* p) = nullptr;
  Result (*memcpy_dtoh_async)(void* dst, DevicePtr src, size_t bytes, Stream s) = nullptr;
  Result (*memcpy_htod_async)(DevicePtr dst, const void* src, size_t bytes, Stream s) = nullptr;
  Result (*memcpy_dtod_async)(DevicePtr dst, DevicePtr src, size_t bytes, Stream s) = nullptr;
  // Interprocess memory.
  Result (*ipc_get_mem_handle)(IpcMemHandle* handle, DevicePtr p) = nullptr;
  Result (*ipc_open_mem_handle)(DevicePtr* p, IpcMemHandle handle, unsigned flags) = nullptr;
  Result (*ipc_close_mem_handle)(DevicePtr p) = nullptr;
  // Kernels.
  Result (*module_load_data)(Module* m, const void* image) = nullptr;
  Result (*module_unload)(Module m) = nullptr;
  Result (*module_get_function)(Function* f, Module m, const char* name) = nullptr;
  Result (*launch_kernel)(Function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared_bytes, Stream s, void** params, void** extra) = nullptr;
  Result (*get_error_string)(Result r, const char** s) = nullptr;

 private:
  CudaDriver() = default;
};

// Makes the context of `stream` current on this thread for the scope (XLA usually has it current
// already; pushing it again is cheap and makes the caller independent of that).
class StreamContext {
 public:
  StreamContext(const CudaDriver& cuda, CudaDriver::Stream stream);
  ~StreamContext();
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

 private:
  const CudaDriver& cuda_;
};

}  // namespace nezha
