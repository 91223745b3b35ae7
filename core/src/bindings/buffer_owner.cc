#include "bindings/buffer_owner.h"

#include <mutex>

namespace py = pybind11;

namespace nezha::bindings {
namespace {

struct HeldViews {
  std::vector<std::unique_ptr<py::buffer_info>> views;
};

std::mutex g_mu;
std::vector<HeldViews*> g_deferred;  // guarded by g_mu
bool g_call_scheduled = false;       // a pending call that drains g_deferred is queued

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

int drain_pending_call(void*) {
  release_deferred();
  return 0;
}

void release(HeldViews* held) {
  if (PyGILState_Check()) {
    delete held;  // PyBuffer_Release for each view
    return;
  }
  if (interpreter_finalizing()) return;
  bool schedule = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_deferred.push_back(held);
    schedule = !g_call_scheduled;
    g_call_scheduled = true;
  }
  // Py_AddPendingCall needs no GIL. Its queue is small; when full, the next submission drains.
  if (schedule && Py_AddPendingCall(&drain_pending_call, nullptr) != 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_call_scheduled = false;
  }
}

}  // namespace

std::shared_ptr<const void> own_buffers(std::vector<std::unique_ptr<py::buffer_info>> views) {
  if (views.empty()) return nullptr;
  auto* held = new HeldViews{std::move(views)};
  return std::shared_ptr<const void>(held, &release);
}

void release_deferred() {
  std::vector<HeldViews*> batch;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    batch.swap(g_deferred);
    g_call_scheduled = false;
  }
  for (HeldViews* held : batch) delete held;
}

size_t deferred_release_count() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_deferred.size();
}

}  // namespace nezha::bindings
