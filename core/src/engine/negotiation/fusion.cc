#include "engine/negotiation/fusion.h"

namespace nezha::engine {

namespace {
// Reductions fuse only when every element is reduced and scaled alike.
bool same_reduction(const Response& a, const Response& b) {
  return a.op == b.op && a.prescale == b.prescale && a.postscale == b.postscale;
}
}  // namespace

bool fusable(const Response& r) {
  if (r.kind != Response::Kind::kExecute || !r.inline_result.empty()) return false;
  switch (r.type) {
    case OpType::kAllreduce:
    case OpType::kAllgather:
    case OpType::kReducescatter:
    case OpType::kBroadcast:
      return true;
    default:
      return false;
  }
}

size_t gathered_elements(const Response& r) {
  // rank_rows holds rank_rows.size() / row_elements.size() ranks' rows per name.
  const size_t names = r.row_elements.size();
  const size_t ranks = names ? r.rank_rows.size() / names : 0;
  size_t elements = 0;
  for (size_t t = 0; t < names; ++t)
    for (size_t i = 0; i < ranks; ++i)
      elements += static_cast<size_t>(r.rank_rows[t * ranks + i] * r.row_elements[t]);
  return elements;
}

size_t fusion_bytes(const Response& r) {
  size_t elements = 0;
  if (r.type == OpType::kAllgather) {
    elements = gathered_elements(r);
  } else {
    for (int64_t c : r.counts) elements += static_cast<size_t>(c);
  }
  return elements * dtype_size(r.dtype);
}

bool fuses_with(const Response& last, const Response& next) {
  if (!fusable(last) || !fusable(next) || last.type != next.type || last.process_set != next.process_set ||
      last.dtype != next.dtype)
    return false;
  switch (next.type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return same_reduction(last, next);
    case OpType::kBroadcast:
      return last.root == next.root;
    default:
      return true;
  }
}

void append_fused(Response& last, const Response& next) {
  last.names.insert(last.names.end(), next.names.begin(), next.names.end());
  last.counts.insert(last.counts.end(), next.counts.begin(), next.counts.end());
  last.row_elements.insert(last.row_elements.end(), next.row_elements.begin(), next.row_elements.end());
  last.rank_rows.insert(last.rank_rows.end(), next.rank_rows.begin(), next.rank_rows.end());
  last.cache_ids.insert(last.cache_ids.end(), next.cache_ids.begin(), next.cache_ids.end());
}

bool inline_fuses_with(const Response& last, const Response& next) {
  auto inline_allreduce = [](const Response& r) {
    return r.kind == Response::Kind::kExecute && r.type == OpType::kAllreduce && r.process_set == 0 &&
           !r.inline_result.empty();
  };
  return inline_allreduce(last) && inline_allreduce(next) && last.dtype == next.dtype &&
         same_reduction(last, next);
}

void append_inline_fused(Response& last, const Response& next) {
  append_fused(last, next);
  last.inline_result += next.inline_result;
}

}  // namespace nezha::engine
