// nezha._core: the one extension module. Dtype dispatch happens here and in the core, never in
// Python; enums come from C++; the GIL is released while waiting.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings/buffer_owner.h"
#include "bindings/current_engine.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "common/knobs.h"
#include "common/logging.h"
#include "engine/completion_queue.h"
#include "engine/engine.h"
#include "engine/negotiation/message_codec.h"
#include "transport/frame.h"
#include "transport/rail_factory.h"

namespace py = pybind11;
using namespace nezha;
using nezha::engine::Engine;
using nezha::engine::EngineConfig;
using nezha::engine::OpHandle;
using nezha::engine::OpType;
using nezha::engine::OutputBytes;
using nezha::engine::TensorEntry;

namespace {

// numpy/PEP 3118 format character -> DataType.
DataType dtype_from_buffer(const py::buffer_info& info) {
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' || f[0] == '|')) f = f.substr(1);
  if (f.size() == 1) {
    switch (f[0]) {
      case 'B': return DataType::kUInt8;
      case 'b': return DataType::kInt8;
      case 'h':
        if (info.itemsize == 2) return DataType::kInt16;
        break;
      case 'H':
        if (info.itemsize == 2) return DataType::kUInt16;
        break;
      case '?': return DataType::kBool;
      case 'e': return DataType::kFloat16;
      case 'f': return DataType::kFloat32;
      case 'd': return DataType::kFloat64;
      case 'i': case 'l': case 'q':
        if (info.itemsize == 4) return DataType::kInt32;
        if (info.itemsize == 8) return DataType::kInt64;
        break;
      default: break;
    }
  }
  throw InvalidArgument("unsupported dtype (buffer format '" + info.format + "', itemsize " +
                        std::to_string(info.itemsize) +
                        "); supported: uint8, int8, int16, uint16, int32, int64, float16, bfloat16, float32, "
                        "float64, bool");
}

void require_contiguous(const py::buffer_info& info, const char* what) {
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != expected)
      throw InvalidArgument(std::string(what) + " is not C-contiguous; pass a contiguous array "
                            "(numpy.ascontiguousarray)");
    expected *= info.shape[d];
  }
}

struct Buffer {
  void* ptr;
  DataType dtype;
  std::vector<int64_t> shape;
  size_t bytes;
  // The Py_buffer view: while it lives, `ptr` stays valid (it references the exporter and locks it
  // against resizing). Operations hand it to the engine (bindings/buffer_owner.h).
  std::unique_ptr<py::buffer_info> info;
};

// dtype_override lets callers pass bfloat16 (or any type numpy lacks) as same-size raw storage.
Buffer view(const py::buffer& b, const char* what, std::optional<DataType> dtype_override,
            bool writable) {
  auto owned = std::make_unique<py::buffer_info>(b.request(writable));
  const py::buffer_info& info = *owned;
  require_contiguous(info, what);
  Buffer out;
  out.ptr = info.ptr;
  out.dtype = dtype_override ? *dtype_override : dtype_from_buffer(info);
  if (static_cast<size_t>(info.itemsize) != dtype_size(out.dtype))
    throw InvalidArgument(std::string(what) + ": dtype " + dtype_name(out.dtype) + " needs " +
                          std::to_string(dtype_size(out.dtype)) + "-byte elements, buffer has " +
                          std::to_string(info.itemsize));
  out.shape.assign(info.shape.begin(), info.shape.end());
  out.bytes = static_cast<size_t>(info.size) * info.itemsize;
  out.info = std::move(owned);
  return out;
}

// Queues `entries`; a synchronous caller (`lead`) runs the engine's loop itself meanwhile for up to
// NEZHA_LEAD_US, without the GIL (engine.h point 5): a small operation is then negotiated, and done
// when rank 0 carries it inline, with no thread wake-up on this rank.
std::vector<std::shared_ptr<OpHandle>> submit_entries(Engine& e, std::vector<TensorEntry> entries, bool lead) {
  static const double lead_s = static_cast<double>(knob_int("NEZHA_LEAD_US")) / 1e6;
  if (!lead || lead_s <= 0) return e.enqueue_all(std::move(entries));
  py::gil_scoped_release release;  // (entries dropped without it release their views later)
  return e.enqueue_all(std::move(entries), lead_s, /*waits_to_end=*/true);
}

// One tensor's entry with its buffers pinned: the operation, not the Python handle, keeps them
// alive until the engine is done with them, so dropping a handle is legal.
TensorEntry make_entry(OpType type, const std::string& name, const std::optional<py::buffer>& input,
                       const std::optional<py::buffer>& output, std::optional<DataType> dtype) {
  TensorEntry entry;
  entry.req.type = type;
  entry.req.name = name;
  std::vector<std::unique_ptr<py::buffer_info>> views;
  if (input) {
    Buffer in = view(*input, "input", dtype, false);
    entry.input = in.ptr;
    entry.req.dtype = in.dtype;
    entry.req.shape = in.shape;
    views.push_back(std::move(in.info));
    if (output) {
      Buffer out = view(*output, "output", dtype, true);
      if (out.bytes != in.bytes || out.dtype != in.dtype)
        throw InvalidArgument("output buffer must have the input's dtype and size");
      entry.output = out.ptr;
      views.push_back(std::move(out.info));
    }
  }
  entry.owner = bindings::own_buffers(std::move(views));
  return entry;
}


}  // namespace

namespace nezha::bindings {
void bind_tf_engine(py::module_& m);                      // bindings/tf_engine.cc
void bind_rails(py::module_& m, py::module_& testing);  // bindings/rails.cc
void bind_planner(py::module_& m);                        // bindings/planner.cc
}  // namespace nezha::bindings

#ifdef NEZHA_WITH_JAX_FFI
namespace nezha::bindings {
void bind_jax_ffi(py::module_& m);       // bindings/jax_ffi.cc
void bind_jax_ffi_cuda(py::module_& m);  // bindings/jax_ffi_cuda.cc
}
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "Nezha native core: engine, multi-rail scheduler, collectives, transports.";

  static py::exception<NezhaError> nezha_error(m, "NezhaError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const NezhaError& e) {
      py::set_error(nezha_error, e.what());
    }
  });

  py::enum_<DataType>(m, "DataType")
      .value("uint8", DataType::kUInt8).value("int8", DataType::kInt8)
      .value("int16", DataType::kInt16).value("uint16", DataType::kUInt16)
      .value("int32", DataType::kInt32).value("int64", DataType::kInt64)
      .value("float16", DataType::kFloat16).value("bfloat16", DataType::kBFloat16)
      .value("float32", DataType::kFloat32).value("float64", DataType::kFloat64)
      .value("bool", DataType::kBool);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("Sum", ReduceOp::kSum).value("Average", ReduceOp::kAverage)
      .value("Min", ReduceOp::kMin).value("Max", ReduceOp::kMax)
      .value("Product", ReduceOp::kProduct);
  py::enum_<OpType>(m, "OpType")
      .value("allreduce", OpType::kAllreduce).value("allgather", OpType::kAllgather)
      .value("broadcast", OpType::kBroadcast).value("alltoall", OpType::kAlltoall)
      .value("reducescatter", OpType::kReducescatter).value("barrier", OpType::kBarrier)
      .value("join", OpType::kJoin);
  py::enum_<engine::Device>(m, "Device",
                            "Where a tensor lives, as Horovod tells CPU from GPU: the ranks must "
                            "agree, and a GPU's float16 is scaled in half precision.")
      .value("cpu", engine::Device::kCpu).value("gpu", engine::Device::kGpu);

  m.def("dtype_size", &dtype_size, "Bytes per element of a DataType.");
  m.def("knobs", [] {
    py::list out;
    for (const auto& k : knob_table()) out.append(py::make_tuple(k.env, k.default_value, k.doc));
    return out;
  }, "The NEZHA_* knob table: (name, default, doc) tuples.");
  m.def("knob_value", [](const std::string& env) { return knob_string(env.c_str()); }, py::arg("env"),
        "A knob's value: its environment variable if set, else the table's default (unknown: InvalidArgument).");
  // Native callers outside Python (XLA FFI handlers) reach the engine nezha.init() attached.
  m.def("attach_engine", [](Engine* e) { bindings::attach_engine(e); }, py::arg("engine").none(true),
        py::call_guard<py::gil_scoped_release>(),
        "Makes `engine` (None: no engine) the one native callers submit to; detaching waits for "
        "submissions in progress.");
  bindings::bind_tf_engine(m);
#ifdef NEZHA_WITH_JAX_FFI
  bindings::bind_jax_ffi(m);
  bindings::bind_jax_ffi_cuda(m);
#endif
  m.def("set_log_level", [](const std::string& s) { set_log_level(parse_log_level(s)); });

  m.def("reduce_into", [](py::buffer dst, py::buffer src, ReduceOp op, std::optional<DataType> dtype) {
    Buffer d = view(dst, "dst", dtype, true), s = view(src, "src", dtype, false);
    if (d.dtype != s.dtype || d.bytes != s.bytes) throw InvalidArgument("dst and src differ in dtype or size");
    collectives::reduce_into(d.ptr, s.ptr, d.bytes / dtype_size(d.dtype), d.dtype, op);
  }, py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("dtype") = py::none(),
     "dst = dst (op) src elementwise with the engine's kernels (for tests).");
  m.def("scale", [](py::buffer buf, double factor, std::optional<DataType> dtype) {
    Buffer b = view(buf, "buf", dtype, true);
    collectives::scale(b.ptr, b.bytes / dtype_size(b.dtype), b.dtype, factor);
  }, py::arg("buf"), py::arg("factor"), py::arg("dtype") = py::none(),
     "buf *= factor with the engine's kernels (for tests).");

  // Parsers exposed for property-based fuzzing from Python (tests/test_wire_fuzz.py): they must
  // only ever return or raise NezhaError, whatever bytes they get.
  py::module_ testing = m.def_submodule("testing", "Hooks for tests: wire-format parsers (fuzzing), rows for the rail kind table.");
  testing.def("parse_frame_header", [](py::bytes raw) {
    std::string b = raw;
    if (b.size() != transport::kFrameHeaderBytes)
      throw ProtocolError("frame header must be " + std::to_string(transport::kFrameHeaderBytes) + " bytes");
    auto h = transport::parse_header(reinterpret_cast<const uint8_t*>(b.data()));
    return py::make_tuple(static_cast<int>(h.type), h.flags, h.tag, h.length);
  }, "Parses a 64-byte frame header: (type, flags, tag, length); ProtocolError if invalid.");
  testing.def("encode_frame_header", [](int type, uint64_t tag, uint64_t length) {
    auto h = transport::encode_header(static_cast<transport::FrameType>(type), tag, length);
    return py::bytes(reinterpret_cast<const char*>(h.data()), h.size());
  });
  testing.def("decode_request_list", [](py::bytes raw) {
    auto list = engine::decode_request_list(std::string(raw));
    return py::make_tuple(list.requests.size(), list.shutdown);
  }, "Decodes a worker->coordinator control message: (number of requests, shutdown).");
  testing.def("decode_response_list", [](py::bytes raw) {
    auto list = engine::decode_response_list(std::string(raw));
    return py::make_tuple(list.responses.size(), list.shutdown);
  }, "Decodes a coordinator->worker control message: (number of responses, shutdown).");
  testing.def("decode_round_message", [](py::bytes raw) {
    auto msg = engine::decode_round_message(std::string(raw));
    return py::make_tuple(msg.round, msg.pending.size(), msg.invalidate.size(), msg.join_gen);
  }, "Decodes a rank<->rank cache-round vector: (round, pending ids, invalidations, join generation).");
  testing.def("sample_round_message", [] {
    engine::RoundMessage m;
    m.round = 5;
    m.join_gen = 1;
    m.pending = {0, 3, 9};
    m.invalidate = {4};
    m.invalidate_versions = {2};
    m.estimates = {{10.0, 8.0, 12}, {25.0, 1.0, 3}};
    return py::bytes(engine::encode(m));
  }, "A valid encoded cache-round vector, as a seed for mutation.");
  testing.def("sample_request_list", [] {
    engine::RequestList list;
    engine::Request r;
    r.name = "grad.layer1.weight";
    r.shape = {64, 32};
    r.splits = {1, 2};
    list.requests = {r, r};
    list.requests[1].cache_id = 3;
    return py::bytes(engine::encode(list));
  }, "A valid encoded request list, as a seed for mutation.");
  testing.def("deferred_release_count", &bindings::deferred_release_count,
              "Operations' buffer views the engine let go of off the GIL, not yet released.");
  testing.def("sample_response_list", [] {
    engine::ResponseList list;
    engine::Response r;
    r.names = {"a", "b"};
    r.counts = {10, 20};
    r.cache_ids = {0, -1};
    r.plan = {{0, 0, 20}, {1, 20, 10}};
    list.responses = {r};
    list.fatal = "";
    return py::bytes(engine::encode(list));
  }, "A valid encoded response list, as a seed for mutation.");

  bindings::bind_rails(m, testing);
  bindings::bind_planner(m);

  py::class_<EngineConfig>(m, "EngineConfig")
      .def(py::init([] { return EngineConfig::from_knobs(); }), "Defaults from NEZHA_* knobs.")
      .def_readwrite("rank", &EngineConfig::rank).def_readwrite("size", &EngineConfig::size)
      .def_readwrite("local_rank", &EngineConfig::local_rank)
      .def_readwrite("local_size", &EngineConfig::local_size)
      .def_readwrite("cross_rank", &EngineConfig::cross_rank)
      .def_readwrite("cross_size", &EngineConfig::cross_size)
      .def_readwrite("rails", &EngineConfig::rails)
      .def_readwrite("host_id", &EngineConfig::host_id)
      .def_readwrite("hierarchical", &EngineConfig::hierarchical)
      .def_readwrite("control_addr", &EngineConfig::control_addr)
      .def_property("secret", [](const EngineConfig& c) { return py::bytes(c.secret); },
                    [](EngineConfig& c, py::bytes b) { c.secret = std::string(b); })
      .def_readwrite("fusion_threshold", &EngineConfig::fusion_threshold)
      .def_readwrite("unfused_bytes", &EngineConfig::unfused_bytes)
      .def_readwrite("cycle_time_ms", &EngineConfig::cycle_time_ms)
      .def_readwrite("timeout_s", &EngineConfig::timeout_s)
      .def_readwrite("connect_timeout_s", &EngineConfig::connect_timeout_s)
      .def_readwrite("stall_check_s", &EngineConfig::stall_check_s)
      .def_readwrite("stall_shutdown_s", &EngineConfig::stall_shutdown_s)
      .def_readwrite("logstep_max_bytes", &EngineConfig::logstep_max_bytes)
      .def_readwrite("halving_max_bytes", &EngineConfig::halving_max_bytes)
      .def_readwrite("balance_bytes", &EngineConfig::balance_bytes)
      .def_readwrite("segment_bytes", &EngineConfig::segment_bytes)
      .def_readwrite("socket_buffer_bytes", &EngineConfig::socket_buffer_bytes);

  py::class_<engine::CompletionQueue, std::shared_ptr<engine::CompletionQueue>>(
      m, "CompletionQueue", "Tokens of finished operations (OpHandle.notify), in completion order.")
      .def(py::init<>())
      .def("pop", &engine::CompletionQueue::pop, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "Waits up to timeout_s for a token; returns every token queued (empty on timeout or close).")
      .def("push", &engine::CompletionQueue::push, py::arg("token"),
           "Queues a token as a finished operation would (e.g. to wake pop() for new work).")
      .def("close", &engine::CompletionQueue::close, "Wakes pop() for good.");

  py::class_<OpHandle, std::shared_ptr<OpHandle>>(m, "OpHandle")
      .def("notify", [](OpHandle& h, std::shared_ptr<engine::CompletionQueue> queue, uint64_t token) {
             h.on_done([queue = std::move(queue), token] { queue->push(token); });
           }, py::arg("queue"), py::arg("token"),
           "Pushes token into queue when the operation finishes (at once if it has).")
      .def("poll", &OpHandle::poll, "True once the operation finished (successfully or not).")
      .def("wait", [](const OpHandle& h, double timeout_s) {
             py::gil_scoped_release release;
             return h.wait_for(timeout_s);
           }, py::arg("timeout_s"), "Waits up to timeout_s; True when finished.")
      .def_property_readonly("error", &OpHandle::error)
      .def("take_output", [](OpHandle& h) {
             // Hands the engine-allocated output to numpy without copying.
             auto* vec = new OutputBytes(std::move(h.result().output));
             py::capsule owner(vec, [](void* p) { delete static_cast<OutputBytes*>(p); });
             return py::array_t<uint8_t>({static_cast<py::ssize_t>(vec->size())}, {1}, vec->data(), owner);
           }, "The engine-allocated output as a flat uint8 numpy array (once).")
      .def_property_readonly("output_shape", [](OpHandle& h) { return h.result().output_shape; })
      .def_property_readonly("received_splits", [](OpHandle& h) { return h.result().received_splits; })
      .def_property_readonly("last_joined_rank", [](OpHandle& h) { return h.result().last_joined_rank; });

  py::class_<Engine>(m, "Engine")
      .def(py::init<EngineConfig>(), py::arg("config"))
      .def("listen_addresses", [](const Engine& e) {
             // Opaque bytes (any byte may occur): bytes, never str.
             py::list out;
             for (const auto& a : e.listen_addresses()) out.append(py::bytes(a));
             return out;
           }, "This rank's addresses, as bytes: [control path per rail..., rail...].")
      .def("connect_and_start", [](Engine& e, const std::vector<std::vector<py::bytes>>& addrs) {
             std::vector<std::vector<std::string>> plain;
             for (const auto& row : addrs) {
               plain.emplace_back();
               for (const auto& a : row) plain.back().push_back(std::string(a));
             }
             py::gil_scoped_release release;
             e.connect_and_start(plain);
           }, py::arg("addrs_by_rank"), "addrs_by_rank[r]: rank r's listen_addresses() (bytes).")
      .def("shutdown", &Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("submit", [](Engine& e, OpType type, const std::string& name, std::optional<py::buffer> input,
                        std::optional<py::buffer> output, std::optional<DataType> dtype, ReduceOp op,
                        double prescale, double postscale, int root, std::vector<int64_t> splits,
                        int32_t process_set, bool lead, engine::Device device) {
             bindings::release_deferred();  // views the engine let go of on its threads meanwhile
             std::vector<TensorEntry> one;
             one.push_back(make_entry(type, name, input, output, dtype));
             engine::Request& req = one.back().req;
             req.op = op;
             req.prescale = prescale;
             req.postscale = postscale;
             req.root = root;
             req.splits = std::move(splits);
             req.process_set = process_set;
             req.device = device;
             return submit_entries(e, std::move(one), lead).at(0);
           }, py::arg("type"), py::arg("name"), py::arg("input") = py::none(),
           py::arg("output") = py::none(), py::arg("dtype") = py::none(),
           py::arg("op") = ReduceOp::kSum, py::arg("prescale") = 1.0, py::arg("postscale") = 1.0,
           py::arg("root") = -1, py::arg("splits") = std::vector<int64_t>{},
           py::arg("process_set") = 0, py::arg("lead") = false,
           py::arg("device") = engine::Device::kCpu,
           "Submits one tensor; returns an OpHandle. The operation keeps its buffers alive until "
           "the engine is done with them, whether or not the handle is kept. lead: the caller is "
           "about to wait for it, and runs the engine's loop meanwhile (NEZHA_LEAD_US). device: "
           "where the caller's tensor lives (the ranks must agree; see Device).")
      .def("submit_group", [](Engine& e, OpType type, const std::string& group,
                              const std::vector<std::string>& names, const std::vector<py::buffer>& inputs,
                              const std::vector<std::optional<py::buffer>>& outputs,
                              const std::vector<std::optional<DataType>>& dtypes, ReduceOp op,
                              double prescale, double postscale, int32_t process_set, bool lead,
                              engine::Device device) {
             bindings::release_deferred();
             const size_t n = names.size();
             if (inputs.size() != n || outputs.size() != n || dtypes.size() != n)
               throw InvalidArgument("submit_group: names, inputs, outputs and dtypes differ in length");
             std::vector<TensorEntry> entries;
             for (size_t i = 0; i < n; ++i) {
               entries.push_back(make_entry(type, names[i], inputs[i], outputs[i], dtypes[i]));
               engine::Request& req = entries.back().req;
               req.op = op;
               req.prescale = prescale;
               req.postscale = postscale;
               req.group = group;
               req.group_size = static_cast<int32_t>(n);
               req.process_set = process_set;
               req.device = device;
             }
             return submit_entries(e, std::move(entries), lead);
           }, py::arg("type"), py::arg("group"), py::arg("names"), py::arg("inputs"),
           py::arg("outputs"), py::arg("dtypes"), py::arg("op") = ReduceOp::kSum,
           py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("process_set") = 0,
           py::arg("lead") = false, py::arg("device") = engine::Device::kCpu,
           "Submits a group's members as one unit: every member is queued or, if any is invalid, none "
           "is. Returns one OpHandle per member. lead: as submit's.")
      .def("add_process_set", &Engine::add_process_set, py::arg("ranks"),
           "Registers a process set on this rank (every rank registers the same sets in the same "
           "order); returns its id.")
      .def("remove_process_set", &Engine::remove_process_set, py::arg("id"),
           "Forgets a process set; False if there was none. Refused while its tensors are in flight.")
      .def("pair_process_set", &Engine::pair_process_set, py::arg("a"), py::arg("b"),
           "The id of the pair set of ranks a and b: known to every rank without registering it.")
      .def("process_set_ranks", &Engine::process_set_ranks, py::arg("id"))
      .def("process_set_ids", &Engine::process_set_ids)
      .def("engine_stats", [](const Engine& e) {
        const engine::EngineStats s = e.stats();
        py::dict d;
        d["tensors_via_coordinator"] = s.tensors_via_coordinator;
        d["tensors_done_by_coordinator"] = s.tensors_done_by_coordinator;
        d["tensors_via_rounds"] = s.tensors_via_rounds;
        d["tensors_by_host_vote"] = s.tensors_by_host_vote;
        d["host_votes_diverted"] = s.host_votes_diverted;
        d["requests_to_coordinator"] = s.requests_to_coordinator;
        d["operations_on_rails"] = s.operations_on_rails;
        d["callers_led"] = s.callers_led;
        return d;
      })
      .def("rail_stats", [](const Engine& e) {
        py::list out;
        for (const auto& s : e.rail_stats()) {
          py::dict d;
          d["name"] = s.name; d["local_addr"] = s.local_addr; d["kind"] = s.kind;
          d["state"] = s.state; d["bytes_sent"] = s.bytes_sent; d["bytes_received"] = s.bytes_received;
          d["lane_bytes_sent"] = s.lane_bytes_sent;
          d["alpha_us"] = s.alpha_us; d["beta_gbps"] = s.beta_gbps; d["share"] = s.share;
          d["bulk_alpha_us"] = s.bulk_alpha_us; d["mid_alpha_us"] = s.mid_alpha_us;
          d["mid_beta_gbps"] = s.mid_beta_gbps; d["min_striped_bytes"] = s.min_striped_bytes;
          out.append(d);
        }
        return out;
      });
}
