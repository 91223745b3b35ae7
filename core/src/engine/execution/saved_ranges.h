// SavedRanges: which byte ranges of an allreduce share's input have been copied aside so far.
//
// With failover on, a share that fails midway is redone on another rail from its input. The ring
// reports each range just before it first overwrites it (CollectiveOptions::before_overwrite); the
// executor copies only those ranges, as the data moves, instead of the whole input up front, which
// would hold every rail idle while it runs. The input is then the saved ranges plus the bytes
// never reported, which still hold it where the operation reads its input (its own buffer in
// place, the caller's input out of place).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace nezha::engine {

class SavedRanges {
 public:
  // Calls copy(begin, end) for every part of [begin, end) not saved yet, then marks it all saved.
  template <class CopyFn>
  void save(size_t begin, size_t end, CopyFn copy) {
    if (begin >= end) return;
    size_t pos = begin;
    auto it = std::lower_bound(ranges_.begin(), ranges_.end(), begin,
                               [](const auto& r, size_t b) { return r.second <= b; });
    for (auto j = it; j != ranges_.end() && j->first < end; ++j) {
      if (j->first > pos) copy(pos, j->first);
      pos = std::max(pos, j->second);
    }
    if (pos < end) copy(pos, end);
    insert(begin, end);
  }

  // Calls f(begin, end) for each saved range, in order.
  template <class Fn>
  void for_each(Fn f) const {
    for (const auto& [b, e] : ranges_) f(b, e);
  }

  // Calls f(b, e) for each part of [begin, end) that is not saved, in order.
  template <class Fn>
  void for_each_gap(size_t begin, size_t end, Fn f) const {
    size_t pos = begin;
    for (const auto& [b, e] : ranges_) {
      if (pos >= end) return;
      if (e <= pos) continue;
      if (b > pos) f(pos, std::min(b, end));
      pos = std::max(pos, e);
    }
    if (pos < end) f(pos, end);
  }
  template <class Fn>
  void for_each_gap(size_t total, Fn f) const {
    for_each_gap(0, total, f);
  }

  size_t bytes() const {
    size_t n = 0;
    for (const auto& [b, e] : ranges_) n += e - b;
    return n;
  }

 private:
  // Adds [begin, end), merging it with the ranges it overlaps or touches.
  void insert(size_t begin, size_t end) {
    auto first = std::lower_bound(ranges_.begin(), ranges_.end(), begin,
                                  [](const auto& r, size_t b) { return r.second < b; });
    auto last = first;
    while (last != ranges_.end() && last->first <= end) {
      begin = std::min(begin, last->first);
      end = std::max(end, last->second);
      ++last;
    }
    first = ranges_.erase(first, last);
    ranges_.insert(first, {begin, end});
  }

  std::vector<std::pair<size_t, size_t>> ranges_;  // sorted, disjoint, not touching
};

}  // namespace nezha::engine
