#include "bindings/current_engine.h"

#include <shared_mutex>

#include "common/error.h"

namespace nezha::bindings {
namespace {
// Submitters hold the lock shared only while enqueuing (and leading the loop, bounded: never
// while waiting), so detaching waits at most for submissions in progress; afterwards nothing
// reaches the engine through here.
std::shared_mutex mu;
engine::Engine* current = nullptr;
}  // namespace

void attach_engine(engine::Engine* engine) {
  std::unique_lock<std::shared_mutex> lock(mu);
  current = engine;
}

std::vector<std::shared_ptr<engine::OpHandle>> submit_to_current(
    std::vector<engine::TensorEntry> entries, double lead_s) {
  std::shared_lock<std::shared_mutex> lock(mu);
  if (current == nullptr)
    throw NezhaError("nezha is not initialized in this process: call nezha.init() (or "
                     "nezha.jax.init()) before running a computation with nezha collectives");
  return current->enqueue_all(std::move(entries), lead_s);
}

double current_timeout_s() {
  std::shared_lock<std::shared_mutex> lock(mu);
  return current == nullptr ? -1.0 : current->config().timeout_s;
}

}  // namespace nezha::bindings
