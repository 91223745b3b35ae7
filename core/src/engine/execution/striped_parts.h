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

}  // namespace nezha::engine
