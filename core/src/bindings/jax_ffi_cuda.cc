// nezha.jax's XLA FFI handler for the CUDA platform: collectives inside jax.jit on GPU buffers.
//
// The engine moves host memory over its rails, so the handler stages: it copies the inputs from
// the device into page-locked host memory on XLA's stream, waits for the stream (so the copies see
// every kernel XLA queued before the call), submits one grouped operation, waits for it, copies the
// results back on the stream and waits again (the staging is reused by the next call). No Python,
// no GIL, one copy each way over PCIe -- what nezha.torch does for CUDA tensors, without the
// io_callback's trip through Python and numpy.
//
// Why synchronous (the CPU handler returns a future): XLA runs a GPU program's custom calls on its
// launch thread in stream order, and the results must be on the device before the kernels queued
// after the call read them. So on a GPU every rank must reach one program's collectives in the same
// order (as with NCCL); the engine still matches them by name, and a rank that waits on a
// collective its peers never reach gets the engine's timeout error, not a hang.
#include <pybind11/pybind11.h>

#include <chrono>
#include <string>
#include <vector>

#include "bindings/current_engine.h"
#include "bindings/jax_ffi_call.h"
#include "bindings/pinned_staging.h"
#include "common/error.h"
#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace nezha::bindings {
namespace {

using engine::OpType;

CudaDriver::DevicePtr device_ptr(const void* p) {
  return static_cast<CudaDriver::DevicePtr>(reinterpret_cast<uintptr_t>(p));
}

size_t aligned(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

// Waits for every handle up to the backstop; "" or the first error.
std::string wait_all(const std::vector<std::shared_ptr<engine::OpHandle>>& handles) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(backstop_s() * 1000));
  for (const auto& h : handles) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (!h->wait_for(left > 0 ? left : 0))
      return "no result before the backstop timeout (the engine did not complete it)";
  }
  return {};
}

ffi::Error collective_cuda(void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           int32_t kind, std::string_view name, int32_t reduce_op, double prescale,
                           double postscale, int32_t root, int32_t process_set) {
  const CallAttrs call{static_cast<OpType>(kind), std::string(name), reduce_op, prescale, postscale,
                       root, process_set};
  try {
    const CudaDriver& cuda = CudaDriver::get();
    StreamContext context(cuda, stream);  // declared first: the staging is returned inside it

    // One staging block: every input, then the outputs the engine writes in place (allreduce and
    // broadcast); the other kinds' results come back in engine-allocated memory.
    const bool in_place = call.type == OpType::kAllreduce || call.type == OpType::kBroadcast;
    size_t total = 0;
    std::vector<size_t> in_at, out_at;
    for (size_t i = 0; i < args.size(); ++i) {
      auto in = args.get<ffi::AnyBuffer>(i);
      if (in.has_error()) return call_error(call.name, "bad buffer at position " + std::to_string(i));
      in_at.push_back(total);
      total += aligned(in->size_bytes());
    }
    if (in_place)
      for (size_t i = 0; i < in_at.size(); ++i) {
        out_at.push_back(total);
        total += aligned(args.get<ffi::AnyBuffer>(i)->size_bytes());
      }
    PinnedStaging::Lease staging = PinnedStaging::get().acquire(cuda, total);

    // The engine reads and writes the staging; the results it allocates itself (allgather,
    // reducescatter, alltoall) go straight from its memory to XLA's output.
    CallEntries made;
    const std::string bad = make_entries(
        call, args, rets,
        [&](size_t i, ffi::AnyBuffer, ffi::AnyBuffer out) {
          return BufferPlace{staging.data() + in_at[i],
                             in_place ? staging.data() + out_at[i] : out.untyped_data()};
        },
        &made);
    if (!bad.empty()) return call_error(call.name, bad);
    std::vector<void*> device_out;
    for (size_t i = 0; i < in_at.size(); ++i)
      device_out.push_back((**rets.get<ffi::AnyBuffer>(i)).untyped_data());

    for (size_t i = 0; i < in_at.size(); ++i) {
      auto in = *args.get<ffi::AnyBuffer>(i);
      if (in.size_bytes() > 0)
        cuda.check(cuda.memcpy_dtoh_async(staging.data() + in_at[i], device_ptr(in.untyped_data()),
                                          in.size_bytes(), stream),
                   "device-to-host copy of an input");
    }
    cuda.check(cuda.stream_synchronize(stream), "stream synchronize before the collective");

    std::vector<std::shared_ptr<engine::OpHandle>> handles;
    try {
      handles = submit_to_current(std::move(made.entries));
    } catch (const std::exception& ex) {
      return call_error(call.name, ex.what());
    }
    std::string error = wait_all(handles);
    if (!error.empty()) {
      staging.abandon();  // the engine may still write into it
      return call_error(call.name, error);
    }
    const auto copy_back = [&](void* to, const void* from, size_t bytes) {
      if (bytes > 0)
        cuda.check(cuda.memcpy_htod_async(device_ptr(to), from, bytes, stream),
                   "host-to-device copy of a result");
    };
    for (size_t i = 0; i < handles.size() && error.empty(); ++i) {
      error = deliver(*handles[i], made.copy_out[i], copy_back);
      if (error.empty() && made.copy_out[i].first == nullptr)  // the engine wrote into the staging
        copy_back(device_out[i], staging.data() + out_at[i], made.copy_out[i].second);
    }
    // Before the staging and the engine's results are released (pageable sources are copied before
    // cuMemcpyHtoDAsync returns; the staging is page-locked, so its copies are truly asynchronous).
    cuda.check(cuda.stream_synchronize(stream), "stream synchronize after the collective");
    if (!error.empty()) return call_error(call.name, error);
    return ffi::Error::Success();
  } catch (const std::exception& ex) {
    return call_error(call.name, ex.what());
  }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NezhaCollectiveCuda, collective_cuda,
                              bind_call(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>()));

}  // namespace

void bind_jax_ffi_cuda(py::module_& m) {
  m.def("jax_ffi_cuda_targets", [] {
    py::dict out;
    out["nezha_collective"] = py::capsule(reinterpret_cast<void*>(&NezhaCollectiveCuda));
    return out;
  }, "XLA FFI handlers (name -> PyCapsule) for jax.ffi.register_ffi_target (platform CUDA); the "
     "CUDA driver is loaded on the first call.");
}

}  // namespace nezha::bindings
