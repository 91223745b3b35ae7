// The CUDA IPC lane's reduction kernels: one per dtype x op, each reading a slice from every rank's
// buffer in rank order (collectives/element_reduce.h: the CPU kernels' own operators, so the bits
// match the CPU's serial rank-order reduction on every rank) and writing it once, scaled if asked.
//
// Built by nvcc at build time into a fatbin (CMakeLists.txt: SASS for sm_75, sm_80, sm_90 and PTX of
// sm_90 for newer GPUs; CUDA 13 compiles for sm_75 and newer only, so a V100/sm_70 needs the kernels
// built with an older toolkit) that is embedded in the library as bytes and loaded with
// cuModuleLoadData on first use (reduce_module.h): nothing here is linked, so nezha builds and imports
// without a toolkit or a driver.
//
// The loops are memory-bound: each thread moves 16 bytes per rank per step when every address is
// 16-byte aligned (the lane aligns its slices so), element by element otherwise, over a grid-stride
// loop. extern "C": the host looks the kernels up by name (reduce_args.h).
#include "collectives/element_reduce.h"
#include "cuda/reduce_args.h"

namespace nezha::cuda {
namespace {

using collectives::element::combine;
using collectives::element::scale_element;
using collectives::element::StorageT;

template <DataType D, ReduceOp O>
__device__ __forceinline__ void reduce_slice(const ReduceArgs& a) {
  using T = StorageT<D>;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool scaled = a.scale != 1.0;
  T* dst = reinterpret_cast<T*>(a.dst);
  size_t done = 0;
  if (a.vectorised) {
    constexpr int kLanes = 16 / sizeof(T);
    struct alignas(16) Pack {
      T v[kLanes];
    };
    const size_t packs = a.count / kLanes;
    for (size_t p = first; p < packs; p += stride) {
      Pack acc = reinterpret_cast<const Pack*>(a.srcs[0])[p];
      for (int r = 1; r < a.ranks; ++r) {
        const Pack x = reinterpret_cast<const Pack*>(a.srcs[r])[p];
#pragma unroll
        for (int k = 0; k < kLanes; ++k) acc.v[k] = combine<D, O>(acc.v[k], x.v[k]);
      }
      if (scaled) {
#pragma unroll
        for (int k = 0; k < kLanes; ++k) acc.v[k] = scale_element<D>(acc.v[k], a.scale);
      }
      reinterpret_cast<Pack*>(dst)[p] = acc;
    }
    done = packs * kLanes;
  }
  for (size_t i = done + first; i < a.count; i += stride) {
    T acc = reinterpret_cast<const T*>(a.srcs[0])[i];
    for (int r = 1; r < a.ranks; ++r) acc = combine<D, O>(acc, reinterpret_cast<const T*>(a.srcs[r])[i]);
    if (scaled) acc = scale_element<D>(acc, a.scale);
    dst[i] = acc;
  }
}

}  // namespace
}  // namespace nezha::cuda

#define NEZHA_REDUCE_KERNEL(tag, dtype, optag, op)                                                  \
  extern "C" __global__ void __launch_bounds__(512) nezha_reduce_##tag##_##optag(                    \
      const nezha::cuda::ReduceArgs a) {                                                             \
    nezha::cuda::reduce_slice<nezha::DataType::dtype, nezha::ReduceOp::op>(a);                       \
  }

#define NEZHA_REDUCE_KERNELS(tag, dtype)            \
  NEZHA_REDUCE_KERNEL(tag, dtype, sum, kSum)        \
  NEZHA_REDUCE_KERNEL(tag, dtype, min, kMin)        \
  NEZHA_REDUCE_KERNEL(tag, dtype, max, kMax)        \
  NEZHA_REDUCE_KERNEL(tag, dtype, prod, kProduct)

NEZHA_REDUCE_KERNELS(u8, kUInt8)
NEZHA_REDUCE_KERNELS(i8, kInt8)
NEZHA_REDUCE_KERNELS(i16, kInt16)
NEZHA_REDUCE_KERNELS(u16, kUInt16)
NEZHA_REDUCE_KERNELS(i32, kInt32)
NEZHA_REDUCE_KERNELS(i64, kInt64)
NEZHA_REDUCE_KERNELS(f16, kFloat16)
NEZHA_REDUCE_KERNELS(bf16, kBFloat16)
NEZHA_REDUCE_KERNELS(f32, kFloat32)
NEZHA_REDUCE_KERNELS(f64, kFloat64)
NEZHA_REDUCE_KERNELS(bool, kBool)
