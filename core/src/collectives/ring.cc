#include "collectives/ring.h"

#include <algorithm>
#include <vector>

#include "collectives/reduce.h"
#include "common/aligned_buffer.h"

namespace nezha::collectives::detail {
namespace {

// Elements [begin, begin + length) of segment k of a block of `total` elements (length may be 0).
struct Segment {
  size_t begin;
  size_t length;
};

Segment segment_of(size_t k, size_t segment_size, size_t total) {
  const size_t begin = std::min(total, k * segment_size);
  return {begin, std::min(segment_size, total - begin)};
}

size_t segments_for(size_t largest_block, size_t segment_size) {
  return (largest_block + segment_size - 1) / segment_size;
}

}  // namespace

void ring_reduce_scatter(transport::Rail& rail, uint8_t* buf, const std::vector<size_t>& counts,
                         DataType dtype, ReduceOp op, size_t segment_elems, TagSequence& tags,
                         const Deadline& deadline) {
  const int n = rail.size();
  const int r = rail.rank();
  if (n == 1) return;
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  if (largest == 0) return;
  const size_t esize = dtype_size(dtype);
  const std::vector<size_t> offsets = prefix_offsets(counts);
  const size_t nseg = segments_for(largest, segment_elems);
  AlignedBuffer scratch(std::min(segment_elems, largest) * esize);
  const int next = ring_mod(r + 1, n);
  const int prev = ring_mod(r - 1, n);

  // Step s: send block r-s-1 (which holds s+1 contributions), receive block r-s-2 and add ours.
  // After n-1 steps the block received last, block r, holds all n contributions.
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = ring_mod(r - s - 1, n);
    const int recv_block = ring_mod(r - s - 2, n);
    for (size_t k = 0; k < nseg; ++k) {
      const Segment out = segment_of(k, segment_elems, counts[send_block]);
      const Segment in = segment_of(k, segment_elems, counts[recv_block]);
      rail.sendrecv(next, buf + (offsets[send_block] + out.begin) * esize, out.length * esize,
                    prev, scratch.data(), in.length * esize, tags.next(), deadline);
      reduce_into(buf + (offsets[recv_block] + in.begin) * esize, scratch.data(), in.length, dtype,
                  op);
    }
  }
}

void ring_allgather(transport::Rail& rail, uint8_t* buf, const std::vector<size_t>& block_bytes,
                    size_t segment_bytes, TagSequence& tags, const Deadline& deadline) {
  const int n = rail.size();
  const int r = rail.rank();
  if (n == 1) return;
  const size_t largest = *std::max_element(block_bytes.begin(), block_bytes.end());
  if (largest == 0) return;
  const std::vector<size_t> offsets = prefix_offsets(block_bytes);
  segment_bytes = std::max<size_t>(segment_bytes, 1);
  const size_t nseg = segments_for(largest, segment_bytes);
  const int next = ring_mod(r + 1, n);
  const int prev = ring_mod(r - 1, n);

  // Step s: forward block r-s (our own at s = 0), receive block r-s-1 straight into place.
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = ring_mod(r - s, n);
    const int recv_block = ring_mod(r - s - 1, n);
    for (size_t k = 0; k < nseg; ++k) {
      const Segment out = segment_of(k, segment_bytes, block_bytes[send_block]);
      const Segment in = segment_of(k, segment_bytes, block_bytes[recv_block]);
      rail.sendrecv(next, buf + offsets[send_block] + out.begin, out.length, prev,
                    buf + offsets[recv_block] + in.begin, in.length, tags.next(), deadline);
    }
  }
}

}  // namespace nezha::collectives::detail
