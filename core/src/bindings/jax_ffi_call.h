// What nezha.jax's CPU and CUDA FFI handlers share: one custom call's attributes, the engine
// entries made from its buffers, and the delivery of a finished operation's result.
//
// The handlers differ only in where the engine reads and writes: the CPU handler gives it XLA's own
// buffers, the CUDA handler host staging it copies the device buffers through (jax_ffi_cuda.cc).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "xla/ffi/api/ffi.h"

namespace nezha::bindings {

// The custom call's attributes, as nezha/jax/_primitive.py lowers them.
struct CallAttrs {
  engine::OpType type;
  std::string name;
  int32_t reduce_op;
  double prescale;
  double postscale;
  int32_t root;  // broadcast: the root; alltoall: the number of ranks (equal splits)
  int32_t process_set;  // 0: every rank of the job
};

// Where the engine reads input i and writes output i. For allreduce and broadcast the engine writes
// `output`; the other kinds return an engine-allocated result that deliver() copies to `output`.
struct BufferPlace {
  void* input;
  void* output;
};

// One call's engine entries, and per entry where its engine-allocated result goes (nullptr: the
// engine writes in place) and how many bytes the compiled program expects there.
struct CallEntries {
  std::vector<engine::TensorEntry> entries;
  std::vector<std::pair<void*, size_t>> copy_out;
};

// Builds the entries of one call. `place(i, in, out)` says where the engine reads and writes buffer
// pair i (the CPU handler: XLA's buffers themselves). Returns an error message, empty on success.
std::string make_entries(const CallAttrs& call, xla::ffi::RemainingArgs& args,
                         xla::ffi::RemainingRets& rets,
                         const std::function<BufferPlace(size_t, xla::ffi::AnyBuffer,
                                                         xla::ffi::AnyBuffer)>& place,
                         CallEntries* out);

// After `handle` finished: its error, or a size mismatch, or "" after copying an engine-allocated
// result to `target` (copy_out entry). `copy` moves the bytes (memcpy on the CPU).
std::string deliver(engine::OpHandle& handle, const std::pair<void*, size_t>& target,
                    const std::function<void(void*, const void*, size_t)>& copy);

// The custom call's buffers and attributes, bound after what a handler binds first (the CUDA
// handler: its stream). Both handlers take them in this order.
template <typename Binding>
auto bind_call(Binding binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<int32_t>("kind")
      .template Attr<std::string_view>("name")
      .template Attr<int32_t>("reduce_op")
      .template Attr<double>("prescale")
      .template Attr<double>("postscale")
      .template Attr<int32_t>("root")
      .template Attr<int32_t>("process_set");
}

xla::ffi::Error call_error(const std::string& name, const std::string& why);

// 2 x NEZHA_TIMEOUT_S + 5 s: the engine fails a dead peer's operation sooner; this bounds one a peer
// never submits.
double backstop_s();

}  // namespace nezha::bindings
