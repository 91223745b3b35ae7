#include "bindings/jax_ffi_call.h"

#include "bindings/current_engine.h"

namespace ffi = xla::ffi;

namespace nezha::bindings {
namespace {

using engine::OpType;

bool to_nezha_dtype(ffi::DataType t, DataType* out) {
  switch (t) {
    case ffi::DataType::PRED: *out = DataType::kBool; return true;
    case ffi::DataType::S8: *out = DataType::kInt8; return true;
    case ffi::DataType::S16: *out = DataType::kInt16; return true;
    case ffi::DataType::U16: *out = DataType::kUInt16; return true;
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

}  // namespace

ffi::Error call_error(const std::string& name, const std::string& why) {
  return ffi::Error(ffi::ErrorCode::kInternal, "nezha collective '" + name + "': " + why);
}

double backstop_s() { return 2 * current_timeout_s() + 5; }

std::string make_entries(const CallAttrs& call, ffi::RemainingArgs& args, ffi::RemainingRets& rets,
                         const std::function<BufferPlace(size_t, ffi::AnyBuffer, ffi::AnyBuffer)>& place,
                         CallEntries* out) {
  if (rets.size() != args.size()) return "expected matching inputs and outputs";
  const size_t n = args.size();
  if (n == 0) return "no tensors";
  const OpType type = call.type;
  for (size_t i = 0; i < n; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out_buffer = rets.get<ffi::AnyBuffer>(i);
    if (in.has_error() || out_buffer.has_error()) return "bad buffer at position " + std::to_string(i);
    ffi::AnyBuffer output = **out_buffer;
    engine::TensorEntry e;
    e.req.type = type;
    e.req.name = n == 1 && type != OpType::kAllreduce ? call.name : call.name + "." + std::to_string(i);
    if (!to_nezha_dtype(in->element_type(), &e.req.dtype))
      return "'" + e.req.name + "': unsupported dtype (supported: bool, int8/16/32/64, uint8/16, "
             "float16, bfloat16, float32, float64)";
    auto dims = in->dimensions();
    e.req.shape.assign(dims.begin(), dims.end());
    if ((type == OpType::kAllgather || type == OpType::kReducescatter) && e.req.shape.empty())
      e.req.shape = {1};
    e.req.op = static_cast<ReduceOp>(call.reduce_op);
    e.req.prescale = call.prescale;
    e.req.postscale = call.postscale;
    e.req.root = call.root;
    e.req.process_set = call.process_set;
    const BufferPlace at = place(i, *in, output);
    e.input = at.input;
    if (type == OpType::kAllreduce || type == OpType::kBroadcast) {
      if (output.size_bytes() != in->size_bytes()) return "'" + e.req.name + "': output and input sizes differ";
      e.output = at.output;
      e.req.group = call.name;
      e.req.group_size = static_cast<int32_t>(n);
      out->copy_out.emplace_back(nullptr, output.size_bytes());
    } else {
      out->copy_out.emplace_back(at.output, output.size_bytes());
    }
    if (type == OpType::kAlltoall) {
      // Equal splits (static shapes inside jit): dim 0 was checked divisible in Python.
      const int64_t rows = e.req.shape.empty() ? 0 : e.req.shape[0];
      const int64_t parts = call.root;  // the number of ranks travels in `root` for alltoall
      e.req.root = -1;
      e.req.splits.assign(static_cast<size_t>(parts), parts > 0 ? rows / parts : 0);
    }
    out->entries.push_back(std::move(e));
  }
  return {};
}

std::string deliver(engine::OpHandle& handle, const std::pair<void*, size_t>& target,
                    const std::function<void(void*, const void*, size_t)>& copy) {
  std::string error = handle.error();
  if (!error.empty() || target.first == nullptr) return error;
  const auto& produced = handle.result().output;
  if (produced.size() != target.second)
    return "the result has " + std::to_string(produced.size()) + " bytes where the compiled "
           "program expects " + std::to_string(target.second) +
           " (inside jit every rank must pass the same shape)";
  if (!produced.empty()) copy(target.first, produced.data(), produced.size());
  return {};
}

}  // namespace nezha::bindings
