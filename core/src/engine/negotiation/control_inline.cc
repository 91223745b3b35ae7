#include "engine/negotiation/control_inline.h"

#include <cstring>

#include "collectives/reduce.h"
#include "common/aligned_buffer.h"
#include "common/error.h"

namespace nezha::engine {
namespace {

std::string reduced(const Response& resp, const std::vector<std::optional<Request>>& by_rank) {
  if (resp.counts.size() != 1) return {};
  const size_t count = static_cast<size_t>(resp.counts[0]);
  const size_t bytes = count * dtype_size(resp.dtype);
  bool any = false;
  for (const auto& r : by_rank) {
    if (r && r->inline_input.size() != bytes) return {};
    any = any || r.has_value();
  }
  if (!any || bytes == 0) return {};
  std::vector<const void*> inputs;
  for (const auto& r : by_rank) inputs.push_back(r ? r->inline_input.data() : nullptr);
  std::string out(bytes, '\0');
  reduce_in_rank_order(inputs, static_cast<int64_t>(count), resp.dtype, resp.op, resp.prescale,
                       effective_postscale(resp, static_cast<int>(by_rank.size())), out.data());
  return out;
}

std::string broadcasted(const Response& resp, const std::vector<std::optional<Request>>& by_rank) {
  if (resp.counts.size() != 1 || resp.root < 0 || resp.root >= static_cast<int>(by_rank.size())) return {};
  const auto& root = by_rank[resp.root];
  const size_t bytes = static_cast<size_t>(resp.counts[0]) * dtype_size(resp.dtype);
  if (!root || bytes == 0 || root->inline_input.size() != bytes) return {};
  return root->inline_input;
}

std::string gathered(const Response& resp, const std::vector<std::optional<Request>>& by_rank) {
  if (resp.row_elements.size() != 1 || resp.rank_rows.size() != by_rank.size()) return {};
  const size_t row_bytes = static_cast<size_t>(resp.row_elements[0]) * dtype_size(resp.dtype);
  std::string out;
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    const auto& r = by_rank[rank];
    if (!r || r->inline_input.size() != static_cast<size_t>(resp.rank_rows[rank]) * row_bytes) return {};
    out += r->inline_input;
  }
  return out;  // empty when every rank gave zero rows: nothing to carry, the rails do it
}

}  // namespace

void reduce_in_rank_order(const std::vector<const void*>& inputs, int64_t count, DataType dtype, ReduceOp op,
                          double prescale, double postscale, void* out) {
  const size_t n = static_cast<size_t>(count);
  const size_t bytes = n * dtype_size(dtype);
  if (bytes == 0) return;
  // Aligned scratch: the reduce kernels read and write whole elements.
  AlignedBuffer acc(bytes), term(bytes);
  for (size_t rank = 0; rank < inputs.size(); ++rank) {
    uint8_t* dst = rank == 0 ? acc.data() : term.data();
    if (inputs[rank]) std::memcpy(dst, inputs[rank], bytes);
    else std::memset(dst, 0, bytes);
    collectives::scale(dst, n, dtype, prescale);
    if (rank > 0) collectives::reduce_into(acc.data(), term.data(), n, dtype, op);
  }
  collectives::scale(acc.data(), n, dtype, postscale);
  std::memcpy(out, acc.data(), bytes);
}

size_t control_inline_max_input_bytes(size_t limit_bytes, int size) {
  return size > 1 ? limit_bytes / static_cast<size_t>(size - 1) : 0;
}

bool wants_inline_input(const Request& req, size_t limit_bytes, int rank, int size) {
  // Never for a process set: rank 0 may not be among its members.
  const bool carries = req.process_set == 0 && (req.type == OpType::kAllreduce || req.type == OpType::kAllgather ||
                       (req.type == OpType::kBroadcast && req.root == rank));
  size_t max_bytes = control_inline_max_input_bytes(limit_bytes, size);
  // An allgather's result, every rank's input, goes back to each of the others: what rank 0 sends
  // stays within the limit too.
  if (req.type == OpType::kAllgather) max_bytes /= static_cast<size_t>(size);
  const size_t bytes = req.bytes();
  return carries && bytes > 0 && bytes <= max_bytes;
}

bool inline_inputs_arrived(const std::vector<std::optional<Request>>& by_rank) {
  const Request* any = nullptr;
  for (const auto& r : by_rank)
    if (r) { any = &*r; break; }
  if (!any) return false;
  if (any->type == OpType::kBroadcast)
    return any->root >= 0 && any->root < static_cast<int>(by_rank.size()) && by_rank[any->root] &&
           !by_rank[any->root]->inline_input.empty();
  if (any->type != OpType::kAllreduce && any->type != OpType::kAllgather) return false;
  for (const auto& r : by_rank)
    if (r && r->inline_input.empty()) return false;
  return true;
}

void spill_inline_results(std::vector<Response>& responses) {
  size_t budget = kControlInlineBytesPerMessage;
  for (Response& r : responses) {
    if (r.inline_result.size() > budget) r.inline_result.clear();
    budget -= r.inline_result.size();
  }
}

std::string inline_result_of(const Response& resp, const std::vector<std::optional<Request>>& by_rank) {
  if (resp.kind != Response::Kind::kExecute) return {};
  switch (resp.type) {
    case OpType::kAllreduce: return reduced(resp, by_rank);
    case OpType::kBroadcast: return broadcasted(resp, by_rank);
    case OpType::kAllgather: return gathered(resp, by_rank);
    default: return {};
  }
}

void deliver_inline_result(const Response& resp, std::vector<TensorEntry>& entries,
                           const std::function<void(const std::string& name, size_t bytes)>& on_done) {
  const size_t esize = dtype_size(resp.dtype);
  const std::string& result = resp.inline_result;
  const bool gather = resp.type == OpType::kAllgather;
  size_t want = 0;  // the result's size this response implies
  int64_t rows = 0;
  if (gather) {
    for (int64_t r : resp.rank_rows) rows += r;
    want = static_cast<size_t>(rows) * static_cast<size_t>(resp.row_elements.empty() ? 0 : resp.row_elements[0]) * esize;
  } else {
    for (int64_t c : resp.counts) want += static_cast<size_t>(c) * esize;
  }
  const bool known = resp.type == OpType::kAllreduce || resp.type == OpType::kBroadcast || gather;
  if (!known || result.size() != want || entries.size() != resp.names.size() ||
      (resp.type != OpType::kAllreduce && entries.size() != 1))
    throw ProtocolError("rank 0 sent a result of " + std::to_string(result.size()) + " bytes for " +
                        op_type_name(resp.type) + " of '" + (resp.names.empty() ? "" : resp.names[0]) +
                        "' (" + std::to_string(want) + " bytes expected)");
  size_t off = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    TensorEntry& e = entries[i];
    const size_t bytes = gather ? want : static_cast<size_t>(resp.counts[i]) * esize;
    if (e.handle) {
      if (gather) {
        e.handle->result().output.assign(result.begin(), result.end());
        e.handle->result().output_shape = with_rows(e.req.shape, rows);
      } else {
        std::memcpy(e.output, result.data() + off, bytes);
      }
      if (on_done) on_done(resp.names[i], bytes);
      e.handle->complete();
    }
    off += bytes;
  }
}

}  // namespace nezha::engine
