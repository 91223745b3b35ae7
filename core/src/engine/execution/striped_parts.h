// How a collective other than allreduce is striped over several rails: which elements of each
// rank's block a rail's share carries. Pure arithmetic, identical on every rank.
//
// The plan (multirail/planner.h) splits a total of T elements into contiguous shares, one per rail
// (offset o_k, count c_k). An allreduce runs each share on its range of the buffer. Broadcast,
// allgather, reducescatter and alltoall move one block per rank (or per pair of ranks), of
// different sizes, so each block of E elements is split in the same proportions: share k carries
// elements [E * o_k / T, E * (o_k + c_k) / T) of every block. The boundaries are rounded down the
// same way everywhere, so the parts of a block tile it exactly, and a sender and its receiver
// (which know the block's size alike) agree on every part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace nezha::engine {

struct BlockPart {
  size_t begin = 0;  // first element of the block this share carries
  size_t count = 0;  // elements
};

// The part of a block of `block` elements carried by the share [offset, offset + count) of a plan
// over `total` elements (total > 0; offset + count <= total).
inline BlockPart block_part(size_t block, size_t offset, size_t count, size_t total) {
  using wide = unsigned __int128;  // block * offset can exceed 64 bits for terabyte plans
  const size_t begin = static_cast<size_t>(static_cast<wide>(block) * offset / total);
  const size_t end = static_cast<size_t>(static_cast<wide>(block) * (offset + count) / total);
  return {begin, end - begin};
}

// The plan's total, the denominator of every part (the shares tile [0, total)).
inline size_t plan_total(const Response& resp) {
  size_t total = 0;
  for (const auto& s : resp.plan) total += s.count;
  return total;
}

// Where one share's parts of a striped operation lie for one rank, in bytes: the share (or a
// balanced range) [offset, offset + count) of a plan over `total` elements carries block_part() of
// every block the operation moves. Vectors have one entry per rank taking part.
struct StripedLayout {
  // Alltoall and reducescatter send a part of every block of the input, one block per peer;
  // broadcast and allgather send (at most) one contiguous part.
  bool packs = false;
  // The contiguous part of the input this rank sends (a broadcast's root, allgather), from the start
  // of the caller's input; with `packs`, input_bytes is the sum of send_bytes.
  size_t input_at = 0, input_bytes = 0;
  std::vector<size_t> send_at, send_bytes;  // packs: the part for peer i, in the input
  std::vector<size_t> recv_at, recv_bytes;  // allgather, alltoall: the part from peer i, in the output
  // Broadcast: the part of the buffer (the root's input, every rank's output). Reducescatter: this
  // rank's reduced part, in its output.
  size_t output_at = 0, output_bytes = 0;
};

// The layout for rank `me` of `n` of the share [offset, offset + count) of `resp`'s plan over
// `total` elements (broadcast: `root` is the root's index among the n ranks). Throws NezhaError for
// an operation that is not striped (allreduce, barrier, join).
StripedLayout striped_layout(const Response& resp, int me, int n, int root, size_t offset, size_t count,
                             size_t total);

}  // namespace nezha::engine
