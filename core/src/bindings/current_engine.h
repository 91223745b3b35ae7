// The process's engine, for native callers that run outside Python (XLA FFI handlers): nezha.init()
// attaches the engine it creates, nezha.shutdown() detaches it before shutting it down.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace nezha::bindings {

void attach_engine(engine::Engine* engine);  // nullptr detaches; waits for submissions in progress

// Submits `entries` to the attached engine as enqueue_all() does (lead_s: see there). Throws
// NezhaError when no engine is attached (nezha.init() not called, or shut down) and whatever
// enqueue_all() throws.
std::vector<std::shared_ptr<engine::OpHandle>> submit_to_current(
    std::vector<engine::TensorEntry> entries, double lead_s = 0);

// The attached engine's operation timeout (NEZHA_TIMEOUT_S), or -1 when none is attached.
double current_timeout_s();

}  // namespace nezha::bindings
