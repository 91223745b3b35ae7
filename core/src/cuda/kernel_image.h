// The reduction kernels' fatbin (reduce_kernels.cu), embedded at build time as bytes: CMake runs nvcc,
// then cmake/embed_file.cmake writes the generated .cc that defines these.
#pragma once

#include <cstddef>

namespace nezha::cuda {

extern const unsigned char kReduceKernelsImage[];
extern const size_t kReduceKernelsImageSize;

}  // namespace nezha::cuda
