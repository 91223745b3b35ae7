// NEZHA_HOST_DEVICE marks the small inline functions that the CPU kernels and the CUDA kernels
// (core/src/cuda/reduce_kernels.cu, compiled by nvcc) share, so both compute the same bits from one
// definition. Under a plain C++ compiler it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define NEZHA_HOST_DEVICE __host__ __device__
#else
#define NEZHA_HOST_DEVICE
#endif
