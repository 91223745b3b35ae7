// XLA FFI handlers for nezha.jax: collectives inside jax.jit without Python.
//
// Why compiled into nezha._core: the handler must reach the process's engine, which _core owns; a
// second extension would need its own copy of the core (STYLE "worth avoiding" 1) or a C ABI to
// find it. Built only when jaxlib's header-only FFI API was found at build time (CMakeLists.txt);
// nezha.jax registers the capsules from jax_ffi_targets() with jax.ffi.register_ffi_target.
//
// The data path: each input and output is XLA's own buffer; the handler submits engine entries
// pointing at them (allreduce and broadcast write straight into XLA's output) and returns an FFI
// future at once; one waiter thread completes the futures as the engine finishes. No GIL, no
// staging copy; operations whose output the engine allocates (allgather, alltoall, reducescatter)
// copy it once into XLA's output.
//
// Why asynchronous, and why no ordering token: the engine matches collectives across ranks by
// name (rank 0 starts a tensor once every rank has submitted it), so ranks may submit a program's
// independent collectives in different orders. What must not happen is a rank blocking an XLA
// thread on one collective before submitting another that a peer waits for: returning a future
// keeps every collective XLA reaches submitted. The custom calls are side-effecting, so XLA never
// drops or merges them; JAX needs no ordered effect (which would take every call off its fast
// dispatch path).
//
// jax_ffi_call.cc builds the engine entries (shared with the CUDA handler, jax_ffi_cuda.cc).
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/current_engine.h"
#include "bindings/jax_ffi_call.h"
#include "common/error.h"
#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace nezha::bindings {
namespace {

using engine::OpType;

// One operation in flight: the engine's handles, where its engine-allocated outputs go, and the
// future XLA waits on.
struct Pending {
  std::string name;
  std::vector<std::shared_ptr<engine::OpHandle>> handles;
  std::vector<std::pair<void*, size_t>> copy_out;  // per handle (see CallEntries)
  std::chrono::steady_clock::time_point deadline;   // a backstop: the engine fails ops sooner
  ffi::Promise promise;
};

// Completes futures as their operations finish. One thread, started on first use and never
// stopped (it may outlive every engine; it holds no Python object). It sleeps on its queue when
// nothing is in flight and otherwise on the oldest operation's handle, in short slices so a later
// operation that finished first is completed promptly too (never head-of-line blocked).
class Waiter {
 public:
  static Waiter& get() {
    static Waiter* waiter = new Waiter();  // leaked on purpose: no destructor races at exit
    return *waiter;
  }

  void add(Pending p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

 private:
  Waiter() { std::thread([this] { run(); }).detach(); }

  static bool done(const Pending& p) {
    for (const auto& h : p.handles)
      if (!h->poll()) return false;
    return true;
  }

  static void finish(Pending& p, bool timed_out) {
    std::string error;
    if (timed_out) error = "no result before the backstop timeout (the engine did not complete it)";
    for (size_t i = 0; error.empty() && i < p.handles.size(); ++i)
      error = deliver(*p.handles[i], p.copy_out[i],
                      [](void* to, const void* from, size_t n) { std::memcpy(to, from, n); });
    if (error.empty())
      p.promise.SetAvailable();
    else
      p.promise.SetError(call_error(p.name, error));
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !queue_.empty(); });
      std::deque<Pending> work;
      work.swap(queue_);
      lock.unlock();
      while (!work.empty()) {
        const auto now = std::chrono::steady_clock::now();
        for (auto it = work.begin(); it != work.end();) {
          const bool timed_out = now >= it->deadline;
          if (timed_out || done(*it)) {
            finish(*it, timed_out);
            it = work.erase(it);
          } else {
            ++it;
          }
        }
        if (work.empty()) break;
        for (const auto& h : work.front().handles)
          if (!h->poll()) {
            h->wait_for(0.001);
            break;
          }
        std::lock_guard<std::mutex> take(mu_);
        while (!queue_.empty()) {
          work.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
};

ffi::Future failed(const std::string& name, const std::string& why) {
  ffi::Promise promise;
  promise.SetError(call_error(name, why));
  return ffi::Future(promise);
}

ffi::Future collective(ffi::RemainingArgs args, ffi::RemainingRets rets, int32_t kind,
                       std::string_view name, int32_t reduce_op, double prescale, double postscale,
                       int32_t root, int32_t process_set) {
  const CallAttrs call{static_cast<OpType>(kind), std::string(name), reduce_op, prescale, postscale,
                       root, process_set};
  CallEntries made;
  const std::string bad = make_entries(
      call, args, rets,
      [](size_t, ffi::AnyBuffer in, ffi::AnyBuffer out) {
        return BufferPlace{in.untyped_data(), out.untyped_data()};  // XLA's own buffers
      },
      &made);
  if (!bad.empty()) return failed(call.name, bad);
  Pending pending;
  pending.name = call.name;
  pending.copy_out = std::move(made.copy_out);
  try {
    pending.handles = submit_to_current(std::move(made.entries));
  } catch (const std::exception& ex) {
    return failed(call.name, ex.what());
  }
  pending.deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(backstop_s() * 1000));
  ffi::Future future(pending.promise);
  Waiter::get().add(std::move(pending));
  return future;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NezhaCollective, collective, bind_call(ffi::Ffi::Bind()));

}  // namespace

void bind_jax_ffi(py::module_& m) {
  m.def("jax_ffi_targets", [] {
    py::dict out;
    out["nezha_collective"] = py::capsule(reinterpret_cast<void*>(&NezhaCollective));
    return out;
  }, "XLA FFI handlers (name -> PyCapsule) for jax.ffi.register_ffi_target (CPU).");
}

}  // namespace nezha::bindings
