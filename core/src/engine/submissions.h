// The tensors this rank submitted and the engine has not executed yet: the one place callers and
// the loop meet. Callers add (any thread); negotiation drains the new names, takes entries when
// their response arrives, and requeues names; the engine fails or closes what is left.
//
// Threads: every member function takes the table's own lock, so any thread may call any of them;
// callbacks passed in run under that lock and must not call back into the table.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/tensor_entry.h"

namespace nezha::engine {

class Submissions {
 public:
  // Queues every entry (each gets a fresh handle, returned in order), or none: throws NezhaError
  // once the engine failed, InvalidArgument after shutdown or for a name already in flight (also
  // twice within `entries`). `on_added(name)` runs for each, under the lock. queue = false: in
  // flight but not handed to negotiation (a host vote runs it; requeue() hands it over after all).
  std::vector<std::shared_ptr<OpHandle>> add(std::vector<TensorEntry> entries,
                                             const std::function<void(const std::string&)>& on_added,
                                             bool queue = true);

  // Negotiation: hands over every name queued since the last call (with its entry, if still in
  // flight), and returns whether shutdown had been requested when they were taken.
  bool drain_new(const std::function<void(const std::string& name, const TensorEntry& entry)>& fn);
  // Negotiation: puts names back to be negotiated again (their entries stay in flight).
  void requeue(std::vector<std::string> names);

  struct Taken {
    std::vector<TensorEntry> entries;  // one per name; default-constructed where absent
    std::vector<bool> present;
    bool join_in_flight = false;  // a join was in flight when they were taken
  };
  // Takes the named entries out of flight; `on_taken(i, entry)` runs for each present one.
  Taken take(const std::vector<std::string>& names,
             const std::function<void(size_t index, const TensorEntry& entry)>& on_taken);

  bool in_flight(const std::string& name) const;
  bool any_in_flight(const std::vector<std::string>& names) const;
  // Runs `remove` unless a tensor of set `id` is in flight (then InvalidArgument naming them).
  bool remove_set_if_idle(int32_t id, const std::function<bool()>& remove);

  void request_shutdown();
  bool shutdown_requested() const;
  // The engine is unusable: remembers the first reason (later add() throws it) and completes
  // every entry's handle with it.
  void fail_all(const std::string& reason);
  // Shut down: completes what was never processed.
  void close();

 private:
  mutable std::mutex mu_;
  std::deque<std::string> new_names_;                        // submitted, not yet negotiated
  std::unordered_map<std::string, TensorEntry> in_flight_;  // submitted, not yet executed
  bool shutdown_requested_ = false;
  std::string failure_;
};

}  // namespace nezha::engine
