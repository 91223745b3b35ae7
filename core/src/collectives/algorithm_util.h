// Helpers shared by the collective algorithms (private to core/src/collectives/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/error.h"

namespace nezha::collectives::detail {

inline void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

// Numbers the messages of one operation: make_tag(seq, 0), make_tag(seq, 1), ... Every rank sends
// and receives the same sequence of messages, so sender and receiver draw the same number for each.
// Steps wrap modulo 2^20 on operations of over a million messages; that is harmless because
// delivery is ordered per pair, and the seq bits still catch a rank running another operation.
class TagSequence {
 public:
  explicit TagSequence(uint64_t seq) : seq_(seq) {}
  uint64_t next() { return make_tag(seq_, step_++); }

 private:
  uint64_t seq_;
  uint64_t step_ = 0;
};

// Start offsets of consecutive blocks of the given sizes (one extra entry: the total).
inline std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  return offsets;
}

// count elements split into n blocks whose sizes differ by at most one (larger blocks first).
inline std::vector<size_t> even_partition(size_t count, int n) {
  std::vector<size_t> sizes(static_cast<size_t>(n), count / static_cast<size_t>(n));
  for (size_t i = 0; i < count % static_cast<size_t>(n); ++i) ++sizes[i];
  return sizes;
}

// count elements split into n blocks that each start on a 64-byte boundary of the buffer (block
// sizes are whole 64-byte units, differing by at most one unit, larger blocks first; the tail shorter
// than a unit goes to the last block). The ring sends blocks and segments of blocks; a block that
// starts off a cache line would sit off a line in the kernel's socket buffers too, where copies cost
// 2-3x (see transport/frame.h).
inline std::vector<size_t> cache_line_partition(size_t count, int n, size_t elem_size) {
  const size_t unit = elem_size == 0 || 64 % elem_size != 0 ? 1 : 64 / elem_size;
  std::vector<size_t> sizes = even_partition(count / unit, n);
  for (size_t& s : sizes) s *= unit;
  sizes.back() += count % unit;
  return sizes;
}

// An allreduce on a rail of one rank: its input is its result, scaled by opt.postscale (announced to
// opt.before_overwrite first). Returns whether the rail has one rank.
bool allreduce_alone(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype,
                     const CollectiveOptions& opt);

// memcpy(out, in, bytes) unless they are the same buffer (an out-of-place allreduce's input, where
// the algorithm runs in place).
void copy_input(const void* in, void* out, size_t bytes);

// The largest power of two <= n (n >= 1): the ranks that run recursive doubling or halving; the
// others fold their data into a partner first.
inline int largest_power_of_two_at_most(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The numbering the log-step and halving/doubling run on (a GroupRail of these members: rank v of
// the view is rail rank members[v]). Where n is not a power of two, ranks p..n-1 of those
// algorithms hand their input to a partner and wait for the result: the only ranks whose share
// lasts the whole operation; their partners return once their last send is in a socket buffer.
// Rank 0 is the coordinator, whose cost models plan every operation from its own shares' times:
// on the rail's numbering it saw a third of what a 128 KB share takes on 6 hosts (0.58 ms where the
// extra ranks waited 2 ms) and its plans put too much on the rail that ran halving/doubling. So
// rail rank 0 is view rank p, an extra rank: it times the whole operation. Every rank numbers
// alike, so the fixed operand order that keeps results bit-identical is still one order. Empty
// where n is a power of two (no fold: the rail's own numbering).
inline std::vector<int> fold_members(int n) {
  const int shift = n - largest_power_of_two_at_most(n);
  std::vector<int> members;
  if (shift == 0) return members;
  for (int v = 0; v < n; ++v) members.push_back((v + shift) % n);
  return members;
}

// Ring neighbour arithmetic that never goes negative.
inline int ring_mod(long long x, int n) { return static_cast<int>(((x % n) + n) % n); }

// Segment size in elements: segment_bytes aligned down to whole elements, at least one.
inline size_t segment_elements(size_t segment_bytes, size_t elem_size) {
  const size_t elems = segment_bytes / elem_size;
  return elems == 0 ? 1 : elems;
}

}  // namespace nezha::collectives::detail
