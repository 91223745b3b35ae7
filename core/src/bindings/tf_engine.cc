// _core's side of nezha.tensorflow's op library (tf_engine_abi.h): the engine table it calls, and
// _core.tf_bind_ops(path) that hands the table to the loaded library.
//
// Why the kernels are asynchronous: TensorFlow runs a graph's ready ops on a few inter-op threads
// in whatever order it likes, and that order differs between ranks. A kernel that blocked its thread
// until its collective finished could hold every thread of one rank on collectives that another
// rank has not submitted yet because its own threads are held the same way: a deadlock once a
// graph has more independent collectives than threads. Here a kernel only submits and returns; the
// engine matches collectives across ranks by name whatever the order, and each call's completion
// reaches TensorFlow through `done` on one thread of ours. No TensorFlow thread ever waits on a
// peer, so every collective a rank's graph reaches is submitted, and each completes once every rank
// has submitted it.
//
// Completion path: each engine handle's on_done hook (run on the engine's thread) counts down the
// call's handles; the last one queues the call for the "nz-tf-done" thread, which runs the library's
// `done` (it copies engine-allocated results into TensorFlow's outputs and resumes TensorFlow's
// executor: work kept off the engine's loop).
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/current_engine.h"
#include "bindings/tf_engine_abi.h"
#include "common/error.h"
#include "common/thread_name.h"
#include "engine/engine.h"

namespace py = pybind11;

// The result the library reads during `done` (declared opaque in the C ABI).
struct NezhaTfResult {
  std::vector<std::shared_ptr<nezha::engine::OpHandle>> handles;
};

namespace nezha::bindings {
namespace {

using engine::OpHandle;
using engine::OpType;

static_assert(NEZHA_TF_ALLREDUCE == static_cast<int>(OpType::kAllreduce) &&
                  NEZHA_TF_ALLGATHER == static_cast<int>(OpType::kAllgather) &&
                  NEZHA_TF_BROADCAST == static_cast<int>(OpType::kBroadcast) &&
                  NEZHA_TF_ALLTOALL == static_cast<int>(OpType::kAlltoall) &&
                  NEZHA_TF_REDUCESCATTER == static_cast<int>(OpType::kReducescatter) &&
                  NEZHA_TF_JOIN == static_cast<int>(OpType::kJoin),
              "the C ABI's kinds are OpType's values");

struct Call {
  NezhaTfResult result;
  std::atomic<size_t> remaining{0};
  NezhaTfDone done = nullptr;
  void* arg = nullptr;
};

// Runs the library's `done` for finished calls, in the order they finished. One thread, started on
// first use and never stopped (it may outlive every engine; it holds no Python object).
class Completer {
 public:
  static Completer& get() {
    static Completer* completer = new Completer();  // leaked on purpose: no destructor races at exit
    return *completer;
  }

  void add(std::shared_ptr<Call> call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(call));
    }
    cv_.notify_one();
  }

 private:
  Completer() { std::thread([this] { run(); }).detach(); }

  void run() {
    name_this_thread("nz-tf-done");
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !queue_.empty(); });
      std::shared_ptr<Call> call = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();  // `done` resumes TensorFlow, which may submit more calls from this thread
      finish(*call);
      call.reset();
      lock.lock();
    }
  }

  static void finish(Call& call) {
    std::string error;
    for (const auto& h : call.result.handles) {
      error = h->error();
      if (!error.empty()) break;
    }
    call.done(call.arg, error.empty() ? &call.result : nullptr,
              error.empty() ? nullptr : error.c_str());
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Call>> queue_;
};

bool grouped(OpType type) {
  return type == OpType::kAllreduce || type == OpType::kBroadcast ||
         type == OpType::kAllgather || type == OpType::kReducescatter;
}

// The engine entries of one call; throws InvalidArgument naming what is wrong.
std::vector<engine::TensorEntry> make_entries(const NezhaTfCall& call, const NezhaTfTensor* tensors,
                                              int32_t n, const std::shared_ptr<const void>& owner) {
  if (call.kind < 0 || call.kind > static_cast<int>(OpType::kJoin) ||
      call.kind == static_cast<int>(OpType::kBarrier))
    throw InvalidArgument("unknown collective kind " + std::to_string(call.kind));
  const auto type = static_cast<OpType>(call.kind);
  const std::string name = call.name == nullptr ? "" : call.name;
  if (type == OpType::kJoin ? n != 0 : (type == OpType::kAlltoall ? n != 1 : n < 1))
    throw InvalidArgument("'" + name + "': " + std::to_string(n) + " tensors for a " +
                          op_type_name(type));
  std::vector<engine::TensorEntry> entries;
  if (type == OpType::kJoin) {
    entries.emplace_back();
    entries.back().req.type = type;
    entries.back().req.name = "join";
    entries.back().owner = owner;
    return entries;
  }
  for (int32_t i = 0; i < n; ++i) {
    const NezhaTfTensor& t = tensors[i];
    engine::TensorEntry e;
    e.req.type = type;
    e.req.name = grouped(type) ? name + "." + std::to_string(i) : name;
    if (t.dtype < 0 || t.dtype >= kNumDataTypes)
      throw InvalidArgument("'" + e.req.name + "': unknown dtype " + std::to_string(t.dtype));
    e.req.dtype = static_cast<DataType>(t.dtype);
    e.req.shape.assign(t.dims, t.dims + t.ndim);
    // A 0-d tensor is one row for the kinds that concatenate or split dim 0 (as numpy's calls).
    if ((type == OpType::kAllgather || type == OpType::kReducescatter) && e.req.shape.empty())
      e.req.shape = {1};
    e.req.op = static_cast<ReduceOp>(call.reduce_op);
    e.req.prescale = call.prescale;
    e.req.postscale = call.postscale;
    e.req.root = call.root;
    e.req.process_set = call.process_set;
    if (grouped(type)) {
      e.req.group = name;
      e.req.group_size = n;
    }
    if (type == OpType::kAlltoall) e.req.splits.assign(call.splits, call.splits + call.num_splits);
    e.input = t.data;
    if (type == OpType::kAllreduce || type == OpType::kBroadcast) {
      if (t.output == nullptr) throw InvalidArgument("'" + e.req.name + "': no output buffer");
      e.output = t.output;
    }
    e.owner = owner;
    entries.push_back(std::move(e));
  }
  return entries;
}

void start(const NezhaTfCall* call, const NezhaTfTensor* tensors, int32_t n, NezhaTfDone done,
           void* arg, NezhaTfRelease release, void* owner_ptr) {
  // Every entry shares one owner: the library's buffers are released once the engine (or this
  // function, when it refuses the call) has dropped the last of them.
  std::shared_ptr<const void> owner(owner_ptr, [release](const void* p) {
    release(const_cast<void*>(p));
  });
  auto state = std::make_shared<Call>();
  state->done = done;
  state->arg = arg;
  try {
    auto entries = make_entries(*call, tensors, n, owner);
    owner.reset();
    state->result.handles = submit_to_current(std::move(entries));
  } catch (const std::exception& ex) {
    owner.reset();
    done(arg, nullptr, ex.what());
    return;
  }
  state->remaining = state->result.handles.size();
  // Registered after `remaining` is set: a handle already done runs its hook at once.
  for (const auto& h : state->result.handles)
    h->on_done([state] {
      if (state->remaining.fetch_sub(1) == 1) Completer::get().add(state);
    });
}

const void* output(const NezhaTfResult* r, int32_t i, size_t* bytes, const int64_t** dims,
                   int32_t* ndim) {
  engine::OpResult& res = r->handles.at(static_cast<size_t>(i))->result();
  *bytes = res.output.size();
  *dims = res.output_shape.data();
  *ndim = static_cast<int32_t>(res.output_shape.size());
  return res.output.data();
}

const int64_t* received_splits(const NezhaTfResult* r, int32_t i, int32_t* n) {
  const auto& splits = r->handles.at(static_cast<size_t>(i))->result().received_splits;
  *n = static_cast<int32_t>(splits.size());
  return splits.data();
}

int32_t last_joined_rank(const NezhaTfResult* r) {
  return r->handles.at(0)->result().last_joined_rank;
}

const NezhaTfEngineApi kApi = {NEZHA_TF_ABI_VERSION, sizeof(NezhaTfEngineApi), &start, &output,
                               &received_splits, &last_joined_rank};

}  // namespace

void bind_tf_engine(py::module_& m) {
  m.def("tf_bind_ops", [](const std::string& path) {
    // RTLD_NOLOAD: only the copy tf.load_op_library loaded (the ops TensorFlow registered).
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr)
      throw NezhaError("nezha.tensorflow's op library is not loaded (" + path + "): load it with "
                       "tf.load_op_library first");
    auto bind = reinterpret_cast<NezhaTfBindFn>(dlsym(lib, NEZHA_TF_BIND_SYMBOL));
    if (bind == nullptr) throw NezhaError(path + " has no " NEZHA_TF_BIND_SYMBOL);
    if (bind(&kApi) != 0)
      throw NezhaError(path + " was built for another version of nezha._core's table (ABI " +
                       std::to_string(NEZHA_TF_ABI_VERSION) + " here): reinstall nezha");
  }, py::arg("path"),
     "Hands the engine's table to nezha.tensorflow's op library at `path` (loaded already).");
}

}  // namespace nezha::bindings
