// Process sets (Horovod's): named subsets of the job's ranks that run collectives among themselves.
//
// Every rank registers the same sets in the same order (add_process_set is collective), so a set's
// id means the same ranks everywhere. Set 0 is every rank and always exists. A set's tensors are
// negotiated by rank 0 like any other, but only its members must submit them, they are fused only
// with tensors of the same set, and they run over a view of each rail restricted to the members
// (transport::GroupRail). Ranks outside a set still see its responses in the ordered stream: they
// step their per-rail operation counters past them, so every rank's counters agree.
//
// Pair sets: any two ranks a < b form the set pair_id(a, b) without registering it, so that a
// point-to-point transfer between two ranks (torch.distributed's send/recv) needs no collective
// call of the others: every rank, rank 0 (which negotiates it) and the ranks that skip it alike,
// derives its members from the id alone.
//
// Threads: any (the engine loop, rail workers, callers); a mutex guards the table.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace nezha::engine {

class ProcessSetTable {
 public:
  explicit ProcessSetTable(int job_size);

  // Registers `ranks` (distinct, in [0, job size), sorted here) under the next id and returns it.
  // Throws InvalidArgument for an empty list, a rank out of range or listed twice.
  int32_t add(std::vector<int> ranks);
  // Forgets a set; false if it did not exist. Set 0 and pair sets cannot be removed
  // (InvalidArgument).
  bool remove(int32_t id);

  // The id of the pair set of ranks a and b (either order; distinct ranks of the job), at or above
  // kFirstPairId. InvalidArgument for a rank out of range or a == b.
  int32_t pair_id(int a, int b) const;
  static constexpr int32_t kFirstPairId = int32_t{1} << 30;

  // The members of set `id` in rank order (set 0: every rank; a pair set: its two ranks); null if
  // no such set.
  std::shared_ptr<const std::vector<int>> members(int32_t id) const;
  // The ids of the registered sets, ascending (0 first); pair sets are not listed.
  std::vector<int32_t> ids() const;

 private:
  const int job_size_;
  mutable std::mutex mu_;
  int32_t next_id_ = 1;
  std::unordered_map<int32_t, std::shared_ptr<const std::vector<int>>> sets_;
  // Pair sets asked for so far; the members travel as shared pointers like a registered set's.
  mutable std::unordered_map<int32_t, std::shared_ptr<const std::vector<int>>> pairs_;
};

// "ranks 0, 2" for messages.
std::string members_str(const std::vector<int>& ranks);

}  // namespace nezha::engine
