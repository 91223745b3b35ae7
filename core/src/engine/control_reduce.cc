#include "engine/control_reduce.h"

#include <cstring>

#include "collectives/reduce.h"
#include "common/aligned_buffer.h"

namespace nezha::engine {

size_t control_reduce_max_input_bytes(size_t limit_bytes, int size) {
  return size > 1 ? limit_bytes / static_cast<size_t>(size - 1) : 0;
}

bool wants_inline_input(const Request& req, size_t limit_bytes, int size) {
  if (req.type != OpType::kAllreduce) return false;
  size_t bytes = req.bytes();
  return bytes > 0 && bytes <= control_reduce_max_input_bytes(limit_bytes, size);
}

void spill_inline_results(std::vector<Response>& responses) {
  size_t budget = kControlReduceBytesPerMessage;
  for (Response& r : responses) {
    if (r.inline_result.size() > budget) r.inline_result.clear();
    budget -= r.inline_result.size();
  }
}

std::string reduce_inline_inputs(const Response& resp, const std::vector<std::optional<Request>>& by_rank) {
  if (resp.kind != Response::Kind::kExecute || resp.type != OpType::kAllreduce || resp.counts.size() != 1)
    return {};
  const size_t count = static_cast<size_t>(resp.counts[0]);
  const size_t bytes = count * dtype_size(resp.dtype);
  bool any = false;
  for (const auto& r : by_rank) {
    if (r && r->inline_input.size() != bytes) return {};
    any = any || r.has_value();
  }
  if (!any || bytes == 0) return {};
  // Aligned scratch: the reduce kernels read and write whole elements.
  AlignedBuffer acc(bytes), term(bytes);
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    uint8_t* dst = rank == 0 ? acc.data() : term.data();
    if (by_rank[rank]) std::memcpy(dst, by_rank[rank]->inline_input.data(), bytes);
    else std::memset(dst, 0, bytes);  // joined: zeros, as on the rails
    collectives::scale(dst, count, resp.dtype, resp.prescale);
    if (rank > 0) collectives::reduce_into(acc.data(), term.data(), count, resp.dtype, resp.op);
  }
  collectives::scale(acc.data(), count, resp.dtype, effective_postscale(resp, static_cast<int>(by_rank.size())));
  return std::string(reinterpret_cast<const char*>(acc.data()), bytes);
}

}  // namespace nezha::engine
