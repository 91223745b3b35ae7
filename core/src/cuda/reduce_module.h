// The reduction kernels (reduce_kernels.cu) as the driver sees them: the embedded fatbin loaded with
// cuModuleLoadData into each CUDA context on first use, kernels looked up by name and launched on a
// stream. Thread-safe; modules stay loaded for the process's life (a few hundred KB per context).
#pragma once

#include "common/cuda_driver.h"
#include "common/dtype.h"
#include "cuda/reduce_args.h"

namespace nezha::cuda {

// Queues args' reduction (reduce_args.h) on `stream`, in the context current on this thread (the
// stream's). Throws NezhaError naming the kernel and the driver's message when the image cannot be
// loaded (no SASS or PTX for this GPU) or the launch fails; InvalidArgument for bad args.
void launch_reduce(const CudaDriver& cuda, DataType dtype, ReduceOp op, const ReduceArgs& args,
                   CudaDriver::Stream stream);

}  // namespace nezha::cuda
