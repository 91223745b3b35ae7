// Executor: broadcasts, allgathers and reducescatters fused into one response (negotiation/fusion.h).
//
// The tensors are packed into one operation of their kind, which then runs exactly as a lone
// tensor's would: on one rail, or striped and balanced over several, kept and redone from its
// packed input when a rail fails (SingleOp, StripedPart: task_kinds.h). When it completes,
// each tensor gets its part of the result and its handle completes (SingleJob::complete).
//
//   broadcast      the tensors back to back (the root's; the others receive into the same buffer);
//                  each tensor's output gets its slice back.
//   allgather      rank i's block is every tensor's rows from rank i, tensor after tensor; each
//                  tensor's result is its part of every rank's gathered block, rank after rank.
//   reducescatter  rank i's block is every tensor's block for rank i, tensor after tensor; this
//                  rank's reduced block is cut back into each tensor's.
//
// The packed operation is element-wise (one element per row), so stripes and balanced ranges may
// cut anywhere in its blocks, as they may in a lone tensor's.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "engine/execution/executor.h"
#include "engine/execution/executor_jobs.h"
#include "engine/execution/task_context.h"

namespace nezha::engine {
namespace {

// Where each tensor lies in the packed blocks of an allgather or reducescatter: elements of
// tensor t in rank i's block, and where they start within it.
class PackedBlocks {
 public:
  PackedBlocks(const Response& r, int ranks) : ranks_(ranks), names_(r.names.size()) {
    if (r.rank_rows.size() != names_ * static_cast<size_t>(ranks) || r.row_elements.size() != names_)
      throw ProtocolError(std::string(op_type_name(r.type)) + " of " + names_str(r) + ": fused layout for " +
                          std::to_string(names_) + " tensors and " + std::to_string(ranks) + " ranks has " +
                          std::to_string(r.rank_rows.size()) + " row counts");
    count_.resize(names_ * ranks);
    at_.resize(names_ * ranks);
    in_tensor_.resize(names_ * ranks);
    block_.assign(ranks, 0);
    std::vector<size_t> tensor_so_far(names_, 0);
    for (int i = 0; i < ranks; ++i)
      for (size_t t = 0; t < names_; ++t) {
        const size_t k = t * ranks + i;
        count_[k] = static_cast<size_t>(r.rank_rows[k] * r.row_elements[t]);
        at_[k] = block_[i];
        block_[i] += count_[k];
        in_tensor_[k] = tensor_so_far[t];
        tensor_so_far[t] += count_[k];
      }
    start_.assign(ranks + 1, 0);
    for (int i = 0; i < ranks; ++i) start_[i + 1] = start_[i] + block_[i];
  }
  size_t count(size_t t, int i) const { return count_[t * ranks_ + i]; }  // elements
  size_t within(size_t t, int i) const { return at_[t * ranks_ + i]; }   // offset in rank i's block
  size_t block(int i) const { return block_[i]; }
  size_t start(int i) const { return start_[i]; }  // of rank i's block, all blocks back to back
  size_t total() const { return start_[ranks_]; }
  // Where tensor t's part for rank i starts within the tensor (its blocks back to back).
  size_t in_tensor(size_t t, int i) const { return in_tensor_[t * ranks_ + i]; }

 private:
  int ranks_;
  size_t names_;
  std::vector<size_t> count_, at_, in_tensor_, block_, start_;
};

// Gives each fused tensor its part of the packed operation's result.
void unpack_fused(SingleJob& job) {
  FusedTensors& f = *job.fused;
  const Response& resp = f.resp;
  const size_t esize = dtype_size(resp.dtype);
  if (resp.type == OpType::kBroadcast) {
    const uint8_t* from = f.buffer.data();
    for (size_t t = 0; t < f.entries.size(); ++t) {
      const size_t bytes = static_cast<size_t>(resp.counts[t]) * esize;
      if (bytes) std::memcpy(f.entries[t].output, from, bytes);
      from += bytes;
    }
    return;
  }
  const int n = f.ranks;
  const PackedBlocks blocks(resp, n);
  const uint8_t* result = job.entry.handle->result().output.data();
  for (size_t t = 0; t < f.entries.size(); ++t) {
    OpResult& res = f.entries[t].handle->result();
    const std::vector<int64_t>& shape = f.entries[t].req.shape;
    if (resp.type == OpType::kAllgather) {
      int64_t rows = 0;
      for (int i = 0; i < n; ++i) rows += resp.rank_rows[t * n + i];
      res.output.resize(static_cast<size_t>(rows * resp.row_elements[t]) * esize);
      uint8_t* to = res.output.data();
      for (int i = 0; i < n; ++i) {
        const size_t bytes = blocks.count(t, i) * esize;
        if (bytes) std::memcpy(to, result + (blocks.start(i) + blocks.within(t, i)) * esize, bytes);
        to += bytes;
      }
      res.output_shape = with_rows(shape, rows);
    } else {
      const int mine = f.index;
      const size_t bytes = blocks.count(t, mine) * esize;
      res.output.resize(bytes);
      if (bytes) std::memcpy(res.output.data(), result + blocks.within(t, mine) * esize, bytes);
      res.output_shape = with_rows(shape, resp.rank_rows[t * n + mine]);
    }
  }
}

}  // namespace

void Executor::run_fused(const Response& resp, std::vector<TensorEntry> entries) {
  auto fused = std::make_shared<FusedTensors>();
  fused->resp = resp;
  fused->entries = std::move(entries);
  const auto [me, n] = place_among(members_of(resp).get(), opt_.rank, opt_.size);
  fused->index = me;
  fused->ranks = n;
  const size_t esize = dtype_size(resp.dtype);
  const size_t names = resp.names.size();
  for (const TensorEntry& e : fused->entries)
    if (!e.handle) throw ProtocolError(std::string(op_type_name(resp.type)) + " of " + names_str(resp) +
                                       ": a fused tensor this rank did not submit");

  Response packed = resp;  // its names still name every tensor (errors, timeline)
  packed.counts.clear();
  packed.row_elements = {1};
  packed.rank_rows.clear();
  TensorEntry op;
  op.req = fused->entries[0].req;  // kind, dtype, op, scales, root and set: the same for all
  op.req.group.clear();
  op.handle = std::make_shared<OpHandle>();
  size_t elements = 0;  // of the packed buffer
  if (resp.type == OpType::kBroadcast) {
    for (int64_t c : resp.counts) elements += static_cast<size_t>(c);
    fused->buffer = ctx_->pool.acquire(std::max<size_t>(1, elements * esize));
    if (opt_.rank == resp.root) {
      uint8_t* to = fused->buffer.data();
      for (size_t t = 0; t < names; ++t) {
        const size_t bytes = static_cast<size_t>(resp.counts[t]) * esize;
        if (bytes) std::memcpy(to, fused->entries[t].input, bytes);
        to += bytes;
      }
    }
    packed.counts = {static_cast<int64_t>(elements)};
    op.req.shape = {static_cast<int64_t>(elements)};
    op.output = fused->buffer.data();  // in place: the root's input, every rank's output
  } else {
    const PackedBlocks blocks(resp, n);
    for (int i = 0; i < n; ++i) packed.rank_rows.push_back(static_cast<int64_t>(blocks.block(i)));
    // Allgather: this rank's block. Reducescatter: every rank's block, in rank order.
    const bool gather = resp.type == OpType::kAllgather;
    elements = gather ? blocks.block(me) : blocks.total();
    fused->buffer = ctx_->pool.acquire(std::max<size_t>(1, elements * esize));
    for (int i = 0; i < n; ++i) {
      if (gather && i != me) continue;
      uint8_t* base = fused->buffer.data() + (gather ? 0 : blocks.start(i)) * esize;
      for (size_t t = 0; t < names; ++t) {
        const size_t bytes = blocks.count(t, i) * esize;
        const auto* from = static_cast<const uint8_t*>(fused->entries[t].input) +
                           (gather ? 0 : blocks.in_tensor(t, i)) * esize;
        if (bytes) std::memcpy(base + blocks.within(t, i) * esize, from, bytes);
      }
    }
    if (!gather) packed.counts = {static_cast<int64_t>(elements)};
    op.req.shape = {static_cast<int64_t>(elements)};
  }
  op.input = fused->buffer.data();
  run_on_one_rail(packed, {std::move(op)}, std::move(fused));
}

void SingleJob::complete(const std::string& error) {
  if (!fused) {
    entry.handle->complete(error);
    return;
  }
  std::string why = error;
  if (why.empty()) {
    try {
      unpack_fused(*this);
    } catch (const std::exception& ex) {  // an output that cannot be allocated
      why = std::string(op_type_name(resp.type)) + " of " + names_str(resp) + ": " + ex.what();
    }
  }
  for (TensorEntry& e : fused->entries) e.handle->complete(why);
}

}  // namespace nezha::engine
