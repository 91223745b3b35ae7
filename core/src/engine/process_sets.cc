#include "engine/process_sets.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace nezha::engine {

std::string members_str(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

ProcessSetTable::ProcessSetTable(int job_size) : job_size_(job_size) {
  // Pair ids are kFirstPairId + a * size + b: they must stay below 2^31.
  if (job_size > 32767) throw InvalidArgument("jobs of more than 32767 ranks are not supported");
  std::vector<int> all(static_cast<size_t>(job_size));
  for (int r = 0; r < job_size; ++r) all[static_cast<size_t>(r)] = r;
  sets_[0] = std::make_shared<const std::vector<int>>(std::move(all));
}

int32_t ProcessSetTable::add(std::vector<int> ranks) {
  if (ranks.empty()) throw InvalidArgument("a process set needs at least one rank");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= job_size_)
      throw InvalidArgument("process set: rank " + std::to_string(ranks[i]) + " is not a rank of the job (size " +
                            std::to_string(job_size_) + ")");
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw InvalidArgument("process set: rank " + std::to_string(ranks[i]) + " is listed twice");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t id = next_id_++;
  sets_[id] = std::make_shared<const std::vector<int>>(std::move(ranks));
  return id;
}

bool ProcessSetTable::remove(int32_t id) {
  if (id == 0) throw InvalidArgument("the global process set (id 0) cannot be removed");
  if (id >= kFirstPairId) throw InvalidArgument("a pair set (id " + std::to_string(id) + ") cannot be removed");
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.erase(id) > 0;
}

int32_t ProcessSetTable::pair_id(int a, int b) const {
  for (int r : {a, b})
    if (r < 0 || r >= job_size_)
      throw InvalidArgument("pair set: rank " + std::to_string(r) + " is not a rank of the job (size " +
                            std::to_string(job_size_) + ")");
  if (a == b) throw InvalidArgument("pair set: rank " + std::to_string(a) + " cannot pair with itself");
  if (a > b) std::swap(a, b);
  return kFirstPairId + a * job_size_ + b;
}

std::shared_ptr<const std::vector<int>> ProcessSetTable::members(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= kFirstPairId) {
    const int64_t offset = int64_t{id} - kFirstPairId;
    const int a = static_cast<int>(offset / job_size_), b = static_cast<int>(offset % job_size_);
    if (a >= b || b >= job_size_) return nullptr;  // not an id pair_id() gives
    auto& members = pairs_[id];
    if (!members) members = std::make_shared<const std::vector<int>>(std::vector<int>{a, b});
    return members;
  }
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<int32_t> ProcessSetTable::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> out;
  for (const auto& [id, m] : sets_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace nezha::engine
