// A stand-in libcuda.so.1 for machines without a GPU, so the CUDA IPC lane's protocol (connect, the
// IPC handles, the chunk pipeline, the waits, a killed rank, a mismatch) runs in CI. Device memory is
// host memory: each cuMemAlloc is a memfd mapping, and an IPC handle names its pid and fd, which a
// peer opens through /proc/<pid>/fd (nothing in /dev/shm). Every "stream" operation runs at once on
// the calling thread. cuLaunchKernel runs the kernel's per-element template
// (collectives/element_reduce.h, what reduce_kernels.cu runs on the GPU) on the CPU, found by the
// kernel's name. What it cannot check: the .cu kernels themselves, real asynchrony, device faults.
//
// Only the entry points common/cuda_driver.cc loads exist here; the test binary finds this library
// first through LD_LIBRARY_PATH (CMakeLists.txt: the "fakecuda." test entries).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "collectives/element_reduce.h"
#include "cuda/reduce_args.h"

using nezha::DataType;
using nezha::ReduceOp;
using nezha::cuda::ReduceArgs;

namespace {

constexpr int kSuccess = 0, kInvalidValue = 1, kNotInitialized = 3, kInvalidContext = 201, kNotFound = 500;
constexpr uint64_t kHandleMagic = 0x66616b6563756461ULL;  // "fakecuda"

struct Allocation {
  size_t bytes;
  int fd;  // -1 for an opened peer mapping
};

std::mutex mu;
std::map<uint64_t, Allocation> allocations;  // by base address: this process's and opened ones
bool initialised = false;
thread_local void* current = nullptr;
char context_token;  // the one "context" of this process

struct IpcHandle {
  uint64_t magic;
  int64_t pid;
  int64_t fd;
  uint64_t bytes;
  char pad[32];
};
static_assert(sizeof(IpcHandle) == 64);

using Kernel = void (*)(const ReduceArgs&);

template <DataType D, ReduceOp O>
void cpu_kernel(const ReduceArgs& a) {
  using T = nezha::collectives::element::StorageT<D>;
  const T* srcs[nezha::cuda::kMaxReduceRanks];
  for (int r = 0; r < a.ranks; ++r) srcs[r] = reinterpret_cast<const T*>(a.srcs[r]);
  T* dst = reinterpret_cast<T*>(a.dst);
  for (size_t i = 0; i < a.count; ++i) {
    T v = nezha::collectives::element::reduce_ranks<D, O>(srcs, a.ranks, i);
    if (a.scale != 1.0) v = nezha::collectives::element::scale_element<D>(v, a.scale);
    dst[i] = v;
  }
}

template <DataType D>
void add_kernels(std::map<std::string, Kernel>& k) {
  const std::string base = std::string("nezha_reduce_") + nezha::cuda::kernel_dtype_tag(D) + "_";
  k[base + "sum"] = &cpu_kernel<D, ReduceOp::kSum>;
  k[base + "min"] = &cpu_kernel<D, ReduceOp::kMin>;
  k[base + "max"] = &cpu_kernel<D, ReduceOp::kMax>;
  k[base + "prod"] = &cpu_kernel<D, ReduceOp::kProduct>;
}

const std::map<std::string, Kernel>& kernels() {
  static const std::map<std::string, Kernel> table = [] {
    std::map<std::string, Kernel> k;
    add_kernels<DataType::kUInt8>(k);
    add_kernels<DataType::kInt8>(k);
    add_kernels<DataType::kInt16>(k);
    add_kernels<DataType::kUInt16>(k);
    add_kernels<DataType::kInt32>(k);
    add_kernels<DataType::kInt64>(k);
    add_kernels<DataType::kFloat16>(k);
    add_kernels<DataType::kBFloat16>(k);
    add_kernels<DataType::kFloat32>(k);
    add_kernels<DataType::kFloat64>(k);
    add_kernels<DataType::kBool>(k);
    return k;
  }();
  return table;
}

int need_context() { return !initialised ? kNotInitialized : current == nullptr ? kInvalidContext : kSuccess; }

}  // namespace

extern "C" {

int cuInit(unsigned) { initialised = true; return kSuccess; }
int cuDeviceGetCount(int* n) { *n = 1; return initialised ? kSuccess : kNotInitialized; }
int cuDeviceGet(int* dev, int ordinal) { *dev = 0; return ordinal == 0 ? kSuccess : kInvalidValue; }
int cuDeviceGetPCIBusId(char* id, int len, int) { std::snprintf(id, static_cast<size_t>(len), "fake:00:00.0"); return kSuccess; }
int cuDevicePrimaryCtxRetain(void** ctx, int) { *ctx = &context_token; return kSuccess; }
int cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }
int cuCtxSetCurrent(void* ctx) { current = ctx; return kSuccess; }
int cuCtxGetCurrent(void** ctx) { *ctx = current; return kSuccess; }
int cuCtxGetDevice(int* dev) { *dev = 0; return need_context(); }
int cuCtxPushCurrent_v2(void* ctx) { current = ctx; return kSuccess; }  // one context: no stack needed
int cuCtxPopCurrent_v2(void** ctx) { if (ctx) *ctx = current; return kSuccess; }
int cuStreamCreate(void** s, unsigned) { *s = std::malloc(1); return need_context(); }
int cuStreamDestroy_v2(void* s) { std::free(s); return kSuccess; }
int cuStreamSynchronize(void*) { return need_context(); }
int cuStreamGetCtx(void*, void** ctx) { *ctx = &context_token; return kSuccess; }

int cuMemAlloc_v2(uint64_t* p, size_t bytes) {
  if (int r = need_context()) return r;
  const int fd = ::memfd_create("fake-cuda-mem", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return 2;  // out of memory
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return 2;
  std::lock_guard<std::mutex> lock(mu);
  *p = reinterpret_cast<uint64_t>(m);
  allocations[*p] = {bytes, fd};
  return kSuccess;
}

int cuMemFree_v2(uint64_t p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(p);
  if (it == allocations.end() || it->second.fd < 0) return kInvalidValue;
  ::munmap(reinterpret_cast<void*>(p), it->second.bytes);
  ::close(it->second.fd);
  allocations.erase(it);
  return kSuccess;
}

int cuMemHostAlloc(void** p, size_t bytes, unsigned) { *p = std::malloc(bytes ? bytes : 1); return kSuccess; }
int cuMemFreeHost(void* p) { std::free(p); return kSuccess; }
int cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void*) { std::memcpy(dst, reinterpret_cast<void*>(src), n); return kSuccess; }
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void*) { std::memcpy(reinterpret_cast<void*>(dst), src, n); return kSuccess; }
int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void*) {
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n);
  return kSuccess;
}

int cuIpcGetMemHandle(IpcHandle* h, uint64_t p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(p);
  if (it == allocations.end() || it->second.fd < 0) return kInvalidValue;
  *h = IpcHandle{kHandleMagic, ::getpid(), it->second.fd, it->second.bytes, {}};
  return kSuccess;
}

int cuIpcOpenMemHandle_v2(uint64_t* p, IpcHandle h, unsigned) {
  if (h.magic != kHandleMagic) return kInvalidValue;
  if (h.pid == ::getpid()) return kInvalidContext;  // as CUDA: a process cannot open its own handle
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidValue;
  void* m = ::mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return kInvalidValue;
  std::lock_guard<std::mutex> lock(mu);
  *p = reinterpret_cast<uint64_t>(m);
  allocations[*p] = {h.bytes, -1};
  return kSuccess;
}

int cuIpcCloseMemHandle(uint64_t p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(p);
  if (it == allocations.end() || it->second.fd >= 0) return kInvalidValue;
  ::munmap(reinterpret_cast<void*>(p), it->second.bytes);
  allocations.erase(it);
  return kSuccess;
}

int cuModuleLoadData(void** m, const void* image) {
  uint32_t magic = 0;
  std::memcpy(&magic, image, 4);
  if (magic != 0xBA55ED50u) return 200;  // CUDA_ERROR_INVALID_IMAGE
  *m = &context_token;
  return need_context();
}
int cuModuleUnload(void*) { return kSuccess; }

int cuModuleGetFunction(void** f, void*, const char* name) {
  auto it = kernels().find(name);
  if (it == kernels().end()) return kNotFound;
  *f = reinterpret_cast<void*>(it->second);
  return kSuccess;
}

int cuLaunchKernel(void* f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void** params,
                   void**) {
  if (int r = need_context()) return r;
  reinterpret_cast<Kernel>(f)(*static_cast<const ReduceArgs*>(params[0]));
  return kSuccess;
}

int cuGetErrorString(int r, const char** s) {
  *s = r == kInvalidValue ? "invalid argument (fake driver)" : r == kInvalidContext ? "invalid context (fake driver)"
       : r == kNotFound ? "named symbol not found (fake driver)" : "error (fake driver)";
  return kSuccess;
}

}  // extern "C"
