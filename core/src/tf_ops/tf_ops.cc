// nezha.tensorflow's op library: the collectives as TensorFlow ops with asynchronous kernels.
//
// Built against TensorFlow's C API only (tensorflow/c/kernels.h, ops.h), so it binds to no
// TensorFlow C++ ABI, and loaded by tf.load_op_library, which registers the ops below and makes
// their Python wrappers. It holds no engine: each kernel calls the table nezha._core hands it
// (bindings/tf_engine_abi.h, bindings/tf_engine.cc), and submits its tensors without waiting for
// them; why that makes every graph complete is written in tf_engine.cc.
//
// The one assumption beyond the C API: TF_AsyncOpKernelDoneCallback is TensorFlow's own
// std::function<void()> passed by address, alive only while compute_async runs (tensorflow/c/
// kernels.cc, CAsyncOpKernel::ComputeAsync); to complete later the kernel moves it into a
// std::function of its own. Both sides use libstdc++ (TensorFlow's Linux wheels do; checked below
// for this side), whose std::function layout is part of its stable ABI.
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/tf_engine_abi.h"
#include "common/dtype.h"
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/ops.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/c/tf_tensor.h"

#if !defined(__GLIBCXX__)
#error "nezha's TensorFlow op library must be built with libstdc++, as TensorFlow's wheels are"
#endif
static_assert(sizeof(std::function<void()>) == 32, "libstdc++'s std::function layout");

#define NEZHA_TF_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using nezha::DataType;

std::atomic<const NezhaTfEngineApi*> engine_api{nullptr};

struct Status {
  TF_Status* s = TF_NewStatus();
  ~Status() { TF_DeleteStatus(s); }
  bool ok() const { return TF_GetCode(s) == TF_OK; }
  std::string message() const { return TF_Message(s); }
};

bool to_nezha_dtype(TF_DataType t, DataType* out) {
  switch (t) {
    case TF_UINT8: *out = DataType::kUInt8; return true;
    case TF_INT8: *out = DataType::kInt8; return true;
    case TF_INT16: *out = DataType::kInt16; return true;
    case TF_UINT16: *out = DataType::kUInt16; return true;
    case TF_INT32: *out = DataType::kInt32; return true;
    case TF_INT64: *out = DataType::kInt64; return true;
    case TF_HALF: *out = DataType::kFloat16; return true;
    case TF_BFLOAT16: *out = DataType::kBFloat16; return true;
    case TF_FLOAT: *out = DataType::kFloat32; return true;
    case TF_DOUBLE: *out = DataType::kFloat64; return true;
    case TF_BOOL: *out = DataType::kBool; return true;
    default: return false;
  }
}
constexpr const char* kTypes =
    "{uint8, int8, int16, uint16, int32, int64, half, bfloat16, float, double, bool}";

// One kernel instance's attributes (one per graph node).
struct Kernel {
  int32_t kind = 0;
  std::string tensor_name;
  int32_t reduce_op = 0;
  int32_t root = -1;
  int32_t process_set = 0;
  int32_t set_size = 0;  // alltoall: ranks of the set (equal splits when none are given)
};

bool takes_scales(int32_t kind) {
  return kind == NEZHA_TF_ALLREDUCE || kind == NEZHA_TF_REDUCESCATTER;
}

// The TensorFlow tensors an operation reads and writes, kept referenced until the engine is done
// with them (the release callback), which may be after TensorFlow was told the op failed.
struct Buffers {
  std::vector<TF_Tensor*> refs;
  ~Buffers() {
    for (TF_Tensor* t : refs) TF_DeleteTensor(t);
  }
};

void release_buffers(void* owner) { delete static_cast<Buffers*>(owner); }

// One kernel call between compute_async and its completion.
struct Pending {
  const Kernel* kernel;
  TF_OpKernelContext* ctx;
  std::function<void()> done;  // TensorFlow's, moved out of compute_async's argument
};

void fail(TF_OpKernelContext* ctx, TF_Code code, const std::string& message) {
  Status st;
  TF_SetStatus(st.s, code, message.c_str());
  TF_OpKernelContext_Failure(ctx, st.s);
}

void finish(Pending* p) {
  std::function<void()> done = std::move(p->done);
  delete p;
  done();
}

// Copies an engine-allocated result into TensorFlow's output `i`; an error message or "".
std::string output_from(TF_OpKernelContext* ctx, int i, const void* data, size_t bytes,
                        const int64_t* dims, int ndim) {
  Status st;
  TF_Tensor* out = TF_AllocateOutput(ctx, i, TF_ExpectedOutputDataType(ctx, i), dims, ndim, bytes,
                                     st.s);
  if (!st.ok()) return st.message();
  std::string error;
  if (TF_TensorByteSize(out) != bytes)
    error = "the result has " + std::to_string(bytes) + " bytes, its shape " +
            std::to_string(TF_TensorByteSize(out));
  else if (bytes > 0)
    std::memcpy(TF_TensorData(out), data, bytes);
  TF_DeleteTensor(out);
  return error;
}

void on_done(void* arg, const NezhaTfResult* result, const char* error) {
  auto* p = static_cast<Pending*>(arg);
  const Kernel& k = *p->kernel;
  const NezhaTfEngineApi* api = engine_api.load();
  std::string why = error == nullptr ? "" : error;
  if (why.empty() && k.kind == NEZHA_TF_JOIN) {
    const int32_t last = api->last_joined_rank(result);
    why = output_from(p->ctx, 0, &last, sizeof(last), nullptr, 0);
  } else if (why.empty() && k.kind != NEZHA_TF_ALLREDUCE && k.kind != NEZHA_TF_BROADCAST) {
    const int n = k.kind == NEZHA_TF_ALLTOALL ? 1 : TF_NumOutputs(p->ctx);
    for (int i = 0; i < n && why.empty(); ++i) {
      size_t bytes = 0;
      const int64_t* dims = nullptr;
      int32_t ndim = 0;
      const void* data = api->output(result, i, &bytes, &dims, &ndim);
      why = output_from(p->ctx, i, data, bytes, dims, ndim);
    }
    if (why.empty() && k.kind == NEZHA_TF_ALLTOALL) {
      int32_t count = 0;
      const int64_t* got = api->received_splits(result, 0, &count);
      std::vector<int32_t> rows(got, got + count);
      const int64_t dim = count;
      why = output_from(p->ctx, 1, rows.data(), rows.size() * sizeof(int32_t), &dim, 1);
    }
    if (!why.empty() && error == nullptr) why = "'" + k.tensor_name + "': " + why;
  }
  if (!why.empty()) fail(p->ctx, TF_FAILED_PRECONDITION, why);
  finish(p);
}

// Reads the call's inputs, allocates the outputs the engine writes in place, and submits. Any
// problem fails the op (never blocks): the caller finishes it.
std::string submit(Pending* p, const NezhaTfEngineApi* api) {
  const Kernel& k = *p->kernel;
  TF_OpKernelContext* ctx = p->ctx;
  const int inputs = TF_NumInputs(ctx);
  const int n = k.kind == NEZHA_TF_JOIN ? 0
                : k.kind == NEZHA_TF_ALLTOALL ? 1
                : inputs - (takes_scales(k.kind) ? 1 : 0);
  auto* bufs = new Buffers;
  std::vector<NezhaTfTensor> tensors(static_cast<size_t>(n));
  std::vector<std::vector<int64_t>> dims(static_cast<size_t>(n));
  auto input = [&](int i) -> TF_Tensor* {
    Status st;
    TF_Tensor* t = nullptr;
    TF_GetInput(ctx, i, &t, st.s);
    if (!st.ok() || t == nullptr) return nullptr;
    bufs->refs.push_back(t);
    return t;
  };
  auto refuse = [&](const std::string& why) {
    delete bufs;
    return "'" + k.tensor_name + "': " + why;
  };
  for (int i = 0; i < n; ++i) {
    TF_Tensor* t = input(i);
    if (t == nullptr) return refuse("input " + std::to_string(i) + " is not readable");
    DataType dtype;
    if (!to_nezha_dtype(TF_TensorType(t), &dtype))
      return refuse("input " + std::to_string(i) + " has a dtype nezha does not carry");
    for (int d = 0; d < TF_NumDims(t); ++d) dims[i].push_back(TF_Dim(t, d));
    NezhaTfTensor& nt = tensors[i];
    nt.dtype = static_cast<int32_t>(dtype);
    nt.ndim = static_cast<int32_t>(dims[i].size());
    nt.dims = dims[i].data();
    nt.data = TF_TensorData(t);
    nt.output = nullptr;
    if (k.kind == NEZHA_TF_ALLREDUCE || k.kind == NEZHA_TF_BROADCAST) {
      Status st;
      TF_Tensor* out = TF_AllocateOutput(ctx, i, TF_TensorType(t), dims[i].data(), nt.ndim,
                                         TF_TensorByteSize(t), st.s);
      if (!st.ok()) return refuse(st.message());
      bufs->refs.push_back(out);
      nt.output = TF_TensorData(out);
    }
  }
  NezhaTfCall call{k.kind, k.tensor_name.c_str(), k.reduce_op, 1.0, 1.0, k.root, k.process_set,
                   nullptr, 0};
  if (takes_scales(k.kind)) {  // float64 inputs: TensorFlow's float attributes are float32
    TF_Tensor* scales = input(n);
    if (scales == nullptr || TF_TensorByteSize(scales) != 2 * sizeof(double))
      return refuse("the scale factors are not two float64 values");
    const auto* f = static_cast<const double*>(TF_TensorData(scales));
    call.prescale = f[0];
    call.postscale = f[1];
  }
  std::vector<int64_t> splits;
  if (k.kind == NEZHA_TF_ALLTOALL) {
    TF_Tensor* given = input(1);
    if (given == nullptr) return refuse("splits are not readable");
    const int64_t rows = dims[0].empty() ? 0 : dims[0][0];
    if (dims[0].empty()) return refuse("alltoall needs a tensor with at least one dimension");
    const auto* s = static_cast<const int64_t*>(TF_TensorData(given));
    splits.assign(s, s + TF_TensorByteSize(given) / sizeof(int64_t));
    if (splits.empty()) {
      if (k.set_size <= 0 || rows % k.set_size != 0)
        return refuse("alltoall without splits needs dim 0 (" + std::to_string(rows) +
                      ") divisible by the number of ranks (" + std::to_string(k.set_size) + ")");
      splits.assign(static_cast<size_t>(k.set_size), rows / k.set_size);
    }
    int64_t sum = 0;
    bool negative = false;
    for (int64_t v : splits) {
      sum += v;
      negative = negative || v < 0;
    }
    if (static_cast<int32_t>(splits.size()) != k.set_size || negative || sum != rows)
      return refuse("splits must be " + std::to_string(k.set_size) + " non-negative counts "
                    "summing to dim 0 (" + std::to_string(rows) + ")");
    call.splits = splits.data();
    call.num_splits = static_cast<int32_t>(splits.size());
  }
  // From here `done` runs exactly once (perhaps before start returns) and owns `p`.
  api->start(&call, tensors.data(), n, &on_done, p, &release_buffers, bufs);
  return {};
}

void compute_async(void* kernel, TF_OpKernelContext* ctx, TF_AsyncOpKernelDoneCallback* done) {
  auto* p = new Pending{static_cast<const Kernel*>(kernel), ctx,
                        std::move(*reinterpret_cast<std::function<void()>*>(done))};
  const NezhaTfEngineApi* api = engine_api.load();
  std::string refused;
  if (api == nullptr)
    refused = "nezha.tensorflow's op library is not bound to nezha._core (import "
              "nezha.tensorflow, which binds it, in the process that runs the graph)";
  else
    refused = submit(p, api);
  if (refused.empty()) return;
  fail(ctx, TF_INVALID_ARGUMENT, refused);
  finish(p);
}

std::string string_attr(TF_OpKernelConstruction* ctx, const char* name, Status& st) {
  if (!TF_OpKernelConstruction_HasAttr(ctx, name, st.s)) return {};
  int32_t list_size = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(ctx, name, &list_size, &total, st.s);
  if (!st.ok() || total <= 0) return {};
  std::string value(static_cast<size_t>(total), '\0');
  TF_OpKernelConstruction_GetAttrString(ctx, name, value.data(), value.size(), st.s);
  return value;
}

template <int32_t kKind>
void* create_kernel(TF_OpKernelConstruction* ctx) {
  auto* k = new Kernel;
  k->kind = kKind;
  Status st;
  k->tensor_name = string_attr(ctx, "tensor_name", st);
  auto int_attr = [&](const char* name, int32_t* out) {
    if (st.ok() && TF_OpKernelConstruction_HasAttr(ctx, name, st.s))
      TF_OpKernelConstruction_GetAttrInt32(ctx, name, out, st.s);
  };
  int_attr("reduce_op", &k->reduce_op);
  int_attr("root_rank", &k->root);
  int_attr("process_set", &k->process_set);
  int_attr("set_size", &k->set_size);
  if (!st.ok()) TF_OpKernelConstruction_Failure(ctx, st.s);
  return k;
}

void delete_kernel(void* kernel) { delete static_cast<Kernel*>(kernel); }

// Output i has input i's shape, for every input but the trailing ones (the scale factors).
template <int kTrailing>
void same_shapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  const int64_t n = TF_ShapeInferenceContextNumInputs(ctx) - kTrailing;
  TF_ShapeHandle* shape = TF_NewShapeHandle();
  for (int64_t i = 0; i < n && TF_GetCode(status) == TF_OK; ++i) {
    TF_ShapeInferenceContextGetInput(ctx, static_cast<int>(i), shape, status);
    if (TF_GetCode(status) == TF_OK)
      TF_ShapeInferenceContextSetOutput(ctx, static_cast<int>(i), shape, status);
  }
  TF_DeleteShapeHandle(shape);
}

// Dim 0 depends on the other ranks: the Python layer sets what it knows.
void unknown_shapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

struct OpSpec {
  const char* name;
  int32_t kind = 0;
  std::vector<std::string> inputs, outputs, attrs;
  void (*shape_fn)(TF_ShapeInferenceContext*, TF_Status*);
  void* (*create)(TF_OpKernelConstruction*);
};

bool register_ops() {
  const std::string list_t = std::string("T: list(") + kTypes + ") >= 1";
  const std::string one_t = std::string("T: ") + kTypes;
  const std::vector<OpSpec> specs = {
      {"NezhaAllreduce", NEZHA_TF_ALLREDUCE, {"tensors: T", "scales: double"}, {"reduced: T"},
       {list_t, "tensor_name: string", "reduce_op: int", "process_set: int = 0"},
       &same_shapes<1>, &create_kernel<NEZHA_TF_ALLREDUCE>},
      {"NezhaBroadcast", NEZHA_TF_BROADCAST, {"tensors: T"}, {"broadcast: T"},
       {list_t, "tensor_name: string", "root_rank: int", "process_set: int = 0"},
       &same_shapes<0>, &create_kernel<NEZHA_TF_BROADCAST>},
      {"NezhaAllgather", NEZHA_TF_ALLGATHER, {"tensors: T"}, {"gathered: T"},
       {list_t, "tensor_name: string", "process_set: int = 0"},
       &unknown_shapes, &create_kernel<NEZHA_TF_ALLGATHER>},
      {"NezhaReducescatter", NEZHA_TF_REDUCESCATTER, {"tensors: T", "scales: double"},
       {"scattered: T"},
       {list_t, "tensor_name: string", "reduce_op: int", "process_set: int = 0"},
       &unknown_shapes, &create_kernel<NEZHA_TF_REDUCESCATTER>},
      {"NezhaAlltoall", NEZHA_TF_ALLTOALL, {"tensor: T", "splits: int64"},
       {"received: T", "received_splits: int32"},
       {one_t, "tensor_name: string", "process_set: int = 0", "set_size: int"},
       &unknown_shapes, &create_kernel<NEZHA_TF_ALLTOALL>},
      {"NezhaJoin", NEZHA_TF_JOIN, {}, {"last_joined_rank: int32"}, {},
       &unknown_shapes, &create_kernel<NEZHA_TF_JOIN>},
  };
  Status st;
  for (const OpSpec& spec : specs) {
    TF_OpDefinitionBuilder* op = TF_NewOpDefinitionBuilder(spec.name);
    for (const auto& a : spec.attrs) TF_OpDefinitionBuilderAddAttr(op, a.c_str());
    for (const auto& in : spec.inputs) TF_OpDefinitionBuilderAddInput(op, in.c_str());
    for (const auto& out : spec.outputs) TF_OpDefinitionBuilderAddOutput(op, out.c_str());
    // Stateful: never pruned, merged with a twin or constant-folded, and ordered by tf.function's
    // automatic control dependencies like every other side effect.
    TF_OpDefinitionBuilderSetIsStateful(op, true);
    TF_OpDefinitionBuilderSetShapeInferenceFunction(op, spec.shape_fn);
    TF_RegisterOpDefinition(op, st.s);
    if (!st.ok()) return false;
    TF_KernelBuilder* kb = TF_NewAsyncKernelBuilder(spec.name, "CPU", spec.create,
                                                    &compute_async, &delete_kernel);
    TF_RegisterKernelBuilder((std::string(spec.name) + "_CPU").c_str(), kb, st.s);
    if (!st.ok()) return false;
  }
  return true;
}

// Registered when TensorFlow loads the library (tf.load_op_library), as its own ops are.
const bool registered = register_ops();

}  // namespace

NEZHA_TF_EXPORT int nezha_tf_bind(const NezhaTfEngineApi* api) {
  if (api == nullptr || api->abi_version != NEZHA_TF_ABI_VERSION ||
      api->struct_size < sizeof(NezhaTfEngineApi))
    return -1;
  engine_api.store(api);
  return registered ? 0 : -1;
}
