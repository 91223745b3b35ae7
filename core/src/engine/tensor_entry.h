// What the engine holds for a tensor this rank submitted. Its own header because every part of the
// engine passes it along (negotiation answers small ones inline, the executor runs the rest, the
// bindings build it), and none of them should have to include another's headers to name it.
#pragma once

#include <memory>

#include "engine/handle.h"
#include "engine/request.h"

namespace nezha::engine {

// A tensor submitted on this rank, waiting for (or in) execution.
//
// The engine owns what an operation touches: `owner` keeps `input` and `output` valid (a framework's
// buffers, pinned by the bindings) for as long as any copy of the entry exists, i.e. while the tensor
// is queued, negotiated, fused, executed, kept for a failover redo or failed, whether or not the
// caller still holds the handle. It is released on whichever thread drops the last copy.
struct TensorEntry {
  Request req;
  const void* input = nullptr;
  void* output = nullptr;  // caller's output (allreduce, broadcast); engine allocates the others
  std::shared_ptr<OpHandle> handle;
  std::shared_ptr<const void> owner;
};

}  // namespace nezha::engine
