// The two halves of a ring allreduce, shared by allreduce_ring, reducescatterv and allgatherv.
//
// Rank r sends to r+1 and receives from r-1. Every message is cut into segments so no single
// transfer (and no scratch buffer) exceeds the segment size. All ranks use the same number of
// segments per step (that of the largest block), sending zero-byte segments where a block is
// shorter: uneven blocks then never desynchronise the message sequence of neighbours. Where the rail
// can buffer a whole segment (Rail::send_buffer_bytes), segment i+1 is sent while segment i is
// received, so links never idle while a segment is reduced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "collectives/algorithm_util.h"
#include "common/dtype.h"
#include "transport/rail.h"

namespace nezha::collectives::detail {

// CollectiveOptions::before_overwrite: offsets are relative to buf.
using OverwriteHook = std::function<void(size_t offset, size_t bytes)>;

// Where the blocks of a ring phase live: block i at blocks[i]. A contiguous buffer's blocks follow
// each other (block_addresses); a striped share's parts of every block lie spread out in the whole
// operation's buffers, and are read and written there, never packed.
std::vector<uint8_t*> block_addresses(uint8_t* buf, const std::vector<size_t>& block_bytes);

// Reduce-scatter over blocks of counts[i] elements. This rank's contribution to block i is read from
// inputs[i] (never written); partial sums are written to blocks[i] (which may be inputs[i]: in
// place). On return blocks[r] on rank r holds the reduction over all ranks of block r; block r-1 is
// never written, other blocks hold partial sums. Each element is reduced along one fixed chain of
// ranks, so the result is identical whichever rank later copies it.
// `postscale` (!= 1) multiplies block r once it is complete (scale()). before_overwrite, if given,
// is called with offsets relative to `hook_base` (the in-place allreduce's buffer).
void ring_reduce_scatter_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& inputs,
                                const std::vector<uint8_t*>& blocks, const std::vector<size_t>& counts,
                                DataType dtype, ReduceOp op, size_t segment_elems, TagSequence& tags,
                                const Deadline& deadline, const OverwriteHook* before_overwrite = nullptr,
                                const uint8_t* hook_base = nullptr, double postscale = 1.0);

// In place on rail.size() consecutive blocks of buf (counts in elements).
void ring_reduce_scatter(transport::PointToPointRail& rail, uint8_t* buf, const std::vector<size_t>& counts,
                         DataType dtype, ReduceOp op, size_t segment_elems, TagSequence& tags,
                         const Deadline& deadline, const OverwriteHook* before_overwrite = nullptr,
                         double postscale = 1.0);

// Block r of rank r (block_bytes[r] bytes at blocks[r]) is filled in. On return every block is
// filled in, copied verbatim from its owner.
void ring_allgather_blocks(transport::PointToPointRail& rail, const std::vector<uint8_t*>& blocks,
                           const std::vector<size_t>& block_bytes, size_t segment_bytes, TagSequence& tags,
                           const Deadline& deadline, const OverwriteHook* before_overwrite = nullptr,
                           const uint8_t* hook_base = nullptr);

// On rail.size() consecutive blocks of buf.
void ring_allgather(transport::PointToPointRail& rail, uint8_t* buf, const std::vector<size_t>& block_bytes,
                    size_t segment_bytes, TagSequence& tags, const Deadline& deadline,
                    const OverwriteHook* before_overwrite = nullptr);

}  // namespace nezha::collectives::detail
