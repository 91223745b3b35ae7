// Keeping an operation's Python buffers alive from C++ that may let go of them on any thread.
//
// An operation's input and output are Python objects (numpy arrays, tensors behind DLPack or the
// buffer protocol). The bindings pin each through its Py_buffer view, which holds a reference to the
// exporter and locks it against resizing, and hand the engine an owner of those views
// (TensorEntry::owner). The engine drops its last copy on its own threads, which never take the GIL:
// a rail worker blocked on the GIL while a Python thread holds it waiting on the engine would
// deadlock. So a release that happens off the GIL is queued and done on a Python thread instead: by
// a pending call the interpreter runs at its next chance, and at the latest by the next submission.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace nezha::bindings {

// An owner of `views` (nullptr when empty). Copies may be dropped on any thread, with or without the
// GIL; the views are released with the GIL held. While the interpreter is finalizing, releases off
// the GIL are skipped: leaking at exit beats touching a dying interpreter.
std::shared_ptr<const void> own_buffers(std::vector<std::unique_ptr<pybind11::buffer_info>> views);

// Releases every view queued off the GIL. Needs the GIL.
void release_deferred();

// Views queued off the GIL and not yet released (for tests).
size_t deferred_release_count();

}  // namespace nezha::bindings
