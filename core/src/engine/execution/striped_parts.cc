#include "engine/execution/striped_parts.h"

#include <string>

#include "common/error.h"

namespace nezha::engine {

StripedLayout striped_layout(const Response& resp, int me, int n, int root, size_t offset, size_t count,
                             size_t total) {
  const size_t esize = dtype_size(resp.dtype);
  const size_t un = static_cast<size_t>(n);
  auto part = [&](size_t block) { return block_part(block, offset, count, total); };
  const size_t row = resp.row_elements.empty() ? 1 : static_cast<size_t>(resp.row_elements[0]);
  StripedLayout l;
  l.send_at.assign(un, 0);
  l.send_bytes.assign(un, 0);
  l.recv_at.assign(un, 0);
  l.recv_bytes.assign(un, 0);
  switch (resp.type) {
    case OpType::kBroadcast: {
      const BlockPart p = part(static_cast<size_t>(resp.counts[0]));
      l.output_at = p.begin * esize;
      l.output_bytes = p.count * esize;
      if (me == root) {
        l.input_at = l.output_at;
        l.input_bytes = l.output_bytes;
      }
      break;
    }
    case OpType::kAllgather: {
      size_t block_at = 0;  // of rank i's block in the output, elements
      for (size_t i = 0; i < un; ++i) {
        const size_t block = static_cast<size_t>(resp.rank_rows[i]) * row;
        const BlockPart p = part(block);
        l.recv_at[i] = (block_at + p.begin) * esize;
        l.recv_bytes[i] = p.count * esize;
        block_at += block;
      }
      const BlockPart mine = part(static_cast<size_t>(resp.rank_rows[me]) * row);
      l.input_at = mine.begin * esize;  // the caller's input is this rank's block alone
      l.input_bytes = mine.count * esize;
      break;
    }
    case OpType::kReducescatter:
    case OpType::kAlltoall: {
      // Blocks of the input in rank order: reducescatter's rows per rank, alltoall's splits.
      const bool alltoall = resp.type == OpType::kAlltoall;
      l.packs = true;
      size_t send_block_at = 0, recv_block_at = 0;
      for (size_t i = 0; i < un; ++i) {
        const size_t block = alltoall ? static_cast<size_t>(resp.splits_matrix[me * un + i]) * row
                                      : static_cast<size_t>(resp.rank_rows[i]) * row;
        const BlockPart p = part(block);
        l.send_at[i] = (send_block_at + p.begin) * esize;
        l.send_bytes[i] = p.count * esize;
        l.input_bytes += l.send_bytes[i];
        send_block_at += block;
        if (alltoall) {
          const size_t rblock = static_cast<size_t>(resp.splits_matrix[i * un + me]) * row;
          const BlockPart r = part(rblock);
          l.recv_at[i] = (recv_block_at + r.begin) * esize;
          l.recv_bytes[i] = r.count * esize;
          recv_block_at += rblock;
        }
      }
      if (!alltoall) {
        // This rank's reduced block is its part of its own block, in an output of that block alone.
        const BlockPart mine = part(static_cast<size_t>(resp.rank_rows[me]) * row);
        l.output_at = mine.begin * esize;
        l.output_bytes = mine.count * esize;
      }
      break;
    }
    default:
      throw NezhaError(std::string("unexpected striped operation ") + op_type_name(resp.type));
  }
  return l;
}

}  // namespace nezha::engine
