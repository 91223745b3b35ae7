// XLA FFI handlers for nezha.jax: collectives inside jax.jit without Python.
//
// Why compiled into nezha._core: the handler must reach the process's engine, which _core owns; a
// second extension would need its own copy of the core (STYLE "worth avoiding" 1) or a C ABI to
// find it. Built only when jaxlib's header-only FFI API was found at build time (CMakeLists.txt);
// nezha.jax registers the capsules from jax_ffi_targets() with jax.ffi.register_ffi_target.
//
// The data path: each input and output is XLA's own buffer; the handler submits engine entries
// pointing at them (allreduce and broadcast write straight into XLA's output) and returns an FFI
// future; one waiter thread completes the futures as the engine finishes. A small call (at most
// 64 KB) is first waited for on XLA's own thread, for up to NEZHA_JAX_WAIT_US, and that thread
// leads the engine loop meanwhile when the loop thread sleeps (engine.h, point 5): it sends the
// request and reads the answer itself. Most finish within it, and the future is then complete when
// XLA gets it, with no thread wake-up of this process on the path that small collectives' latency
// is made of. No GIL, no staging copy; operations whose
// output the engine allocates (allgather, alltoall, reducescatter) copy it once into XLA's output.
//
// Why asynchronous, and why no ordering token: the engine matches collectives across ranks by
// name (rank 0 starts a tensor once every rank has submitted it), so ranks may submit a program's
// independent collectives in different orders. What must not happen is a rank blocking an XLA
// thread on one collective before submitting another that a peer waits for: returning a future
// keeps every collective XLA reaches submitted (the short wait above only delays that once, by a
// bounded time). The custom calls are side-effecting, so XLA never drops or merges them; JAX needs
// no ordered effect (which would take every call off its fast dispatch path).
//
// jax_ffi_call.cc builds the engine entries (shared with the CUDA handler, jax_ffi_cuda.cc).
#include <pybind11/pybind11.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/current_engine.h"
#include "bindings/jax_ffi_call.h"
#include "common/error.h"
#include "common/knobs.h"
#include "common/thread_name.h"
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

// How the futures were completed (jax_ffi_stats(): tests and benchmarks).
std::atomic<uint64_t> completed_on_calling_thread{0}, completed_in_background{0};

// Copies engine-allocated results out and completes the future (XLA goes on on this thread).
void finish(Pending& p, bool timed_out) {
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

// How long XLA's thread waits for a call of `bytes` itself (0: not at all). A small collective is
// latency-bound: handing its completion to the waiter thread costs one more wake-up, which on a
// busy host is a good part of its time, while a bounded wait can never deadlock (a collective that
// waits for another of the same program costs this wait once, then completes in the background).
// Up to 64 KB (the latency-bound sizes; about what a 1 Gbit/s rail moves in the default wait):
// a larger call would mostly outlast the wait and only hold XLA's thread for nothing.
double own_thread_wait_s(size_t bytes) {
  constexpr size_t kMaxBytes = 64 << 10;
  static const int64_t wait_us = knob_int("NEZHA_JAX_WAIT_US");
  return wait_us > 0 && bytes <= kMaxBytes ? static_cast<double>(wait_us) * 1e-6 : 0;
}

// Asks for transparent huge pages under XLA's output (where it spans whole 2 MiB pages), as numpy
// does for its arrays of 4 MiB and more. XLA hands a large call a fresh output each time and the
// engine first touches it from the rail workers, inside the ring: 16384 faults of 4 KiB for 64 MB,
// ~40 ms of CPU per call on each rank here, against ~550 with huge pages. A jitted 64 MB allreduce
// on two 1 Gbit/s rails: 1.81-1.82 Gbit/s, 1.84-1.86 with huge pages, 1.86 into a reused output
// (interleaved, one run). Without THP (or with it "never") madvise fails or does nothing: harmless.
void prefer_huge_pages(void* at, size_t bytes) {
  constexpr size_t kMinBytes = size_t{4} << 20;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (at == nullptr || bytes < kMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(at) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(at) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Whether every handle finished within wait_s in all.
bool all_done_within(const std::vector<std::shared_ptr<engine::OpHandle>>& handles, double wait_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (const auto& h : handles) {
    const double left = std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count();
    if (!h->poll() && (left <= 0 || !h->wait_for(left))) return false;
  }
  return true;
}

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

  void run() {
    name_this_thread("nz-jax-waiter");
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
            ++completed_in_background;  // before: finishing wakes whoever reads the count
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
  size_t bytes = 0;
  for (size_t i = 0; i < made.entries.size(); ++i) {
    const auto& e = made.entries[i];
    bytes += e.req.bytes();
    // Before the engine may write there (deliver() copies the others' results in later).
    prefer_huge_pages(e.output ? e.output : pending.copy_out[i].first, pending.copy_out[i].second);
  }
  double wait_s = 0;
  const auto called = std::chrono::steady_clock::now();
  try {
    wait_s = own_thread_wait_s(bytes);
    // XLA's thread leads the engine loop for the wait when the loop thread sleeps (engine.h,
    // point 5): no wake-up of the loop thread to send the request, nor of this one for the answer.
    pending.handles = submit_to_current(std::move(made.entries), wait_s);
  } catch (const std::exception& ex) {
    return failed(call.name, ex.what());
  }
  ffi::Future future(pending.promise);
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - called).count();
  if (wait_s > 0 && all_done_within(pending.handles, std::max(0.0, wait_s - waited_s))) {
    ++completed_on_calling_thread;
    finish(pending, /*timed_out=*/false);
    return future;
  }
  pending.deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(backstop_s() * 1000));
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
  m.def("jax_ffi_stats", [] {
    py::dict out;
    out["completed_on_calling_thread"] = completed_on_calling_thread.load();
    out["completed_in_background"] = completed_in_background.load();
    return out;
  }, "How the CPU handler's calls completed: waited for on XLA's thread (small ones, within "
     "NEZHA_JAX_WAIT_US) or by the waiter thread.");
}

}  // namespace nezha::bindings
