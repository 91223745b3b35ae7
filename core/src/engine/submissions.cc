#include "engine/submissions.h"

#include "common/error.h"

namespace nezha::engine {

std::vector<std::shared_ptr<OpHandle>> Submissions::add(std::vector<TensorEntry> entries,
                                                        const std::function<void(const std::string&)>& on_added,
                                                        bool queue) {
  std::vector<std::shared_ptr<OpHandle>> handles;
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) throw NezhaError(failure_);
  if (shutdown_requested_) throw InvalidArgument("nezha has been shut down");
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i].req.name;
    bool repeated = in_flight_.count(name) > 0;
    for (size_t j = 0; j < i && !repeated; ++j) repeated = entries[j].req.name == name;
    if (repeated)
      throw InvalidArgument("tensor name '" + name + "' is already in flight; wait for it before reusing the name");
  }
  for (auto& entry : entries) {
    entry.handle = std::make_shared<OpHandle>();
    handles.push_back(entry.handle);
    std::string name = entry.req.name;
    in_flight_.emplace(name, std::move(entry));
    if (queue) new_names_.push_back(name);
    on_added(name);
  }
  return handles;
}

bool Submissions::drain_new(const std::function<void(const std::string&, const TensorEntry&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& name : new_names_) {
    auto it = in_flight_.find(name);
    if (it != in_flight_.end()) fn(name, it->second);
  }
  new_names_.clear();
  return shutdown_requested_;
}

void Submissions::requeue(std::vector<std::string> names) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& name : names) new_names_.push_back(std::move(name));
}

Submissions::Taken Submissions::take(const std::vector<std::string>& names,
                                     const std::function<void(size_t, const TensorEntry&)>& on_taken) {
  Taken t;
  std::lock_guard<std::mutex> lock(mu_);
  t.join_in_flight = in_flight_.count(kJoinTensorName) > 0;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = in_flight_.find(names[i]);
    if (it == in_flight_.end()) {
      t.entries.emplace_back();
      t.present.push_back(false);
      continue;
    }
    on_taken(i, it->second);
    t.entries.push_back(std::move(it->second));
    t.present.push_back(true);
    in_flight_.erase(it);
  }
  return t;
}

bool Submissions::in_flight(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_.count(name) > 0;
}

bool Submissions::any_in_flight(const std::vector<std::string>& names) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& n : names)
    if (in_flight_.count(n) > 0) return true;
  return false;
}

bool Submissions::remove_set_if_idle(int32_t id, const std::function<bool()>& remove) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string busy;
  for (const auto& [name, entry] : in_flight_)
    if (entry.req.process_set == id && id != 0) busy += (busy.empty() ? "'" : ", '") + name + "'";
  if (!busy.empty())
    throw InvalidArgument("process set " + std::to_string(id) + " still has tensors in flight: " + busy);
  return remove();
}

void Submissions::request_shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_requested_ = true;
}

bool Submissions::shutdown_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_requested_;
}

void Submissions::fail_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = reason;
  for (auto& [name, e] : in_flight_)
    if (e.handle) e.handle->complete("tensor '" + name + "': " + reason);
  in_flight_.clear();
  new_names_.clear();
}

void Submissions::close() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, e] : in_flight_)
    if (e.handle) e.handle->complete("nezha shut down before tensor '" + name + "' was processed");
  in_flight_.clear();
}

}  // namespace nezha::engine
