#include "cuda/reduce_module.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common/error.h"
#include "cuda/kernel_image.h"

namespace nezha::cuda {
namespace {

constexpr unsigned kThreads = 512;    // the kernels' __launch_bounds__
constexpr size_t kMaxBlocks = 2048;   // grid-stride beyond: enough to fill any GPU of today

CudaDriver::Function kernel_for(const CudaDriver& cuda, DataType dtype, ReduceOp op) {
  static std::mutex mu;
  static std::map<CudaDriver::Context, CudaDriver::Module> modules;
  static std::map<std::tuple<CudaDriver::Context, int, int>, CudaDriver::Function> kernels;
  CudaDriver::Context ctx = nullptr;
  cuda.check(cuda.ctx_get_current(&ctx), "cuCtxGetCurrent (reduction kernels)");
  if (ctx == nullptr) throw NezhaError("CUDA reduction kernels: no CUDA context is current on this thread");
  // Average is Sum's kernel (scaled): one cache entry per kernel name.
  const ReduceOp kernel_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  const auto key = std::make_tuple(ctx, static_cast<int>(dtype), static_cast<int>(kernel_op));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = kernels.find(key); it != kernels.end()) return it->second;
  CudaDriver::Module& module = modules[ctx];
  if (module == nullptr)
    cuda.check(cuda.module_load_data(&module, kReduceKernelsImage),
               "cuModuleLoadData of nezha's reduction kernels (built for sm_75, sm_80, sm_90 + PTX)");
  const std::string name = std::string("nezha_reduce_") + kernel_dtype_tag(dtype) + "_" + kernel_op_tag(kernel_op);
  CudaDriver::Function f = nullptr;
  cuda.check(cuda.module_get_function(&f, module, name.c_str()), ("cuModuleGetFunction " + name).c_str());
  kernels[key] = f;
  return f;
}

}  // namespace

void launch_reduce(const CudaDriver& cuda, DataType dtype, ReduceOp op, const ReduceArgs& args,
                   CudaDriver::Stream stream) {
  if (!is_valid_dtype(static_cast<int>(dtype)) || !is_valid_reduce_op(static_cast<int>(op)))
    throw InvalidArgument("CUDA reduction: unknown dtype or op code");
  if (args.ranks < 1 || args.ranks > kMaxReduceRanks)
    throw InvalidArgument("CUDA reduction: " + std::to_string(args.ranks) + " ranks (1 to " +
                          std::to_string(kMaxReduceRanks) + " supported)");
  if (args.count == 0) return;
  CudaDriver::Function f = kernel_for(cuda, dtype, op);
  const size_t lanes = args.vectorised ? 16 / dtype_size(dtype) : 1;
  const size_t work = (args.count + lanes - 1) / lanes;
  const unsigned blocks = static_cast<unsigned>(std::clamp<size_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
  ReduceArgs copy = args;  // the driver reads kernel parameters when the launch is queued
  void* params[] = {&copy};
  cuda.check(cuda.launch_kernel(f, blocks, 1, 1, kThreads, 1, 1, 0, stream, params, nullptr),
             (std::string("cuLaunchKernel nezha_reduce_") + kernel_dtype_tag(dtype) + "_" + kernel_op_tag(op)).c_str());
}

}  // namespace nezha::cuda
