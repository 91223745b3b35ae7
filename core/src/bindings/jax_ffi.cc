// XLA FFI handlers for nezha.jax: collectives inside jax.jit without Python.
//
// Why compiled into nezha._core: the handler must reach the process's engine, which _core owns; a
// second extension would need its own copy of the core (STYLE "worth avoiding" 1) or a C ABI to
// find it. Built only when jaxlib's header-only FFI API was found at build time (CMakeLists.txt);
// nezha.jax registers the capsules from jax_ffi_targets() with jax.ffi.register_ffi_target.
//
// The data path: each input and output is XLA's own buffer; the handler submits engine entries
// pointing at them (allreduce and broadcast write straight into XLA's output) and blocks this XLA
// thread until the engine is done. No GIL, no staging copy. Operations whose output the engine
// allocates (allgather, alltoall, reducescatter) copy it once into XLA's output. Ordering is the
// caller's: nezha.jax threads an ordered-effect token through every call (the first argument and
// result, ignored here), so XLA neither drops, reorders nor merges them and every rank issues
// them in program order.
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/current_engine.h"
#include "common/error.h"
#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace nezha::bindings {
namespace {

using engine::OpType;
using engine::TensorEntry;

bool to_nezha_dtype(ffi::DataType t, DataType* out) {
  switch (t) {
    case ffi::DataType::PRED: *out = DataType::kBool; return true;
    case ffi::DataType::S8: *out = DataType::kInt8; return true;
    case ffi::DataType::S16: *out = DataType::kInt16; return true;
    case ffi::DataType::S32: *out = DataType::kInt32; return true;
    case ffi::DataType::S64: *out = DataType::kInt64; return true;
    case ffi::DataType::U8: *out = DataType::kUInt8; return true;
    case ffi::DataType::F16: *out = DataType::kFloat16; return true;
    case ffi::DataType::BF16: *out = DataType::kBFloat16; return true;
    case ffi::DataType::F32: *out = DataType::kFloat32; return true;
    case ffi::DataType::F64: *out = DataType::kFloat64; return true;
    default: return false;
  }
}

ffi::Error fail(const std::string& name, const std::string& why) {
  return ffi::Error(ffi::ErrorCode::kInternal, "nezha collective '" + name + "': " + why);
}

// Waits for every handle, bounded: the engine fails an operation within its own timeout, so this
// limit is only a backstop against an engine bug (never an endless wait inside XLA).
std::string wait_all(const std::vector<std::shared_ptr<engine::OpHandle>>& handles, double limit_s) {
  for (const auto& h : handles) {
    if (!h->wait_for(limit_s))
      return "no result after " + std::to_string(limit_s) + " s (the engine did not complete it)";
    if (!h->error().empty()) return h->error();
  }
  return {};
}

ffi::Error collective(ffi::RemainingArgs args, ffi::RemainingRets rets, int32_t kind,
                      std::string_view name_view, int32_t reduce_op, double prescale,
                      double postscale, int32_t root) {
  const std::string name(name_view);
  const OpType type = static_cast<OpType>(kind);
  // Argument and result 0 are the ordering token.
  if (args.size() < 1 || rets.size() != args.size())
    return fail(name, "expected a token plus matching inputs and outputs");
  const size_t n = args.size() - 1;
  const double limit_s = 2 * current_timeout_s() + 30;

  std::vector<TensorEntry> entries;
  std::vector<ffi::AnyBuffer> inputs, outputs;
  for (size_t i = 0; i < n; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i + 1);
    auto out = rets.get<ffi::AnyBuffer>(i + 1);
    if (in.has_error() || out.has_error()) return fail(name, "bad buffer at position " + std::to_string(i));
    inputs.push_back(*in);
    outputs.push_back(**out);
    TensorEntry e;
    e.req.type = type;
    e.req.name = n == 1 && type != OpType::kAllreduce ? name : name + "." + std::to_string(i);
    if (!to_nezha_dtype(in->element_type(), &e.req.dtype))
      return fail(e.req.name, "unsupported dtype (supported: bool, int8/16/32/64, uint8, "
                              "float16, bfloat16, float32, float64)");
    auto dims = in->dimensions();
    e.req.shape.assign(dims.begin(), dims.end());
    if (type == OpType::kAllgather || type == OpType::kReducescatter) {
      if (e.req.shape.empty()) e.req.shape = {1};
    }
    e.req.op = static_cast<ReduceOp>(reduce_op);
    e.req.prescale = prescale;
    e.req.postscale = postscale;
    e.req.root = root;
    e.input = in->untyped_data();
    if (type == OpType::kAllreduce || type == OpType::kBroadcast) {
      e.output = outputs.back().untyped_data();
      if (outputs.back().size_bytes() != in->size_bytes())
        return fail(e.req.name, "output and input sizes differ");
      e.req.group = name;
      e.req.group_size = static_cast<int32_t>(n);
    }
    if (type == OpType::kAlltoall) {
      // Equal splits (static shapes inside jit): dim 0 was checked divisible in Python.
      const int64_t rows = e.req.shape.empty() ? 0 : e.req.shape[0];
      const int64_t parts = root;  // the number of ranks travels in `root` for alltoall
      e.req.root = -1;
      e.req.splits.assign(static_cast<size_t>(parts), parts > 0 ? rows / parts : 0);
    }
    entries.push_back(std::move(e));
  }
  if (type == OpType::kBarrier) {
    TensorEntry e;
    e.req.type = type;
    e.req.name = name;
    entries.push_back(std::move(e));
  }

  std::vector<std::shared_ptr<engine::OpHandle>> handles;
  try {
    handles = submit_to_current(std::move(entries));
  } catch (const std::exception& ex) {
    return fail(name, ex.what());
  }
  std::string error = wait_all(handles, limit_s);
  if (!error.empty()) return fail(name, error);

  if (type == OpType::kAllgather || type == OpType::kReducescatter || type == OpType::kAlltoall) {
    for (size_t i = 0; i < n; ++i) {
      const auto& produced = handles[i]->result().output;
      if (produced.size() != outputs[i].size_bytes())
        return fail(name, "the result has " + std::to_string(produced.size()) +
                              " bytes where the compiled program expects " +
                              std::to_string(outputs[i].size_bytes()) +
                              " (inside jit every rank must pass the same shape)");
      if (!produced.empty()) std::memcpy(outputs[i].untyped_data(), produced.data(), produced.size());
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NezhaCollective, collective,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int32_t>("kind")
                                  .Attr<std::string_view>("name")
                                  .Attr<int32_t>("reduce_op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int32_t>("root"));

}  // namespace

void bind_jax_ffi(py::module_& m) {
  m.def("jax_ffi_targets", [] {
    py::dict out;
    out["nezha_collective"] = py::capsule(reinterpret_cast<void*>(&NezhaCollective));
    return out;
  }, "XLA FFI handlers (name -> PyCapsule) for jax.ffi.register_ffi_target (CPU).");
}

}  // namespace nezha::bindings
