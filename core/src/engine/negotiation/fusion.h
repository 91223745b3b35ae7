// Which negotiated responses Coordinator::fuse merges into one operation, and how (every rank
// executes what rank 0 decides, so only rank 0 applies these rules).
//
// Allreduces, allgathers, reducescatters and broadcasts are fused with the response before them
// when both are of the same kind, process set and dtype (reductions: the same op and scales;
// broadcasts: the same root), neither was done by rank 0 inline, neither is of at least
// unfused_bytes and together they stay within the fusion threshold: a grouped_allgather's or
// broadcast_parameters' many small tensors then cross the rails as one striped operation
// (executor_fused.cc) rather than one start-up each. Alltoall, barrier and join run alone.
//
// A fused response lists per name, in order: counts (allreduce, broadcast, reducescatter: the
// tensor's elements), row_elements (allgather, reducescatter: elements per dim-0 row) and
// rank_rows (allgather, reducescatter: one entry per rank taking part, name after name).
#pragma once

#include <cstddef>

#include "engine/request.h"

namespace nezha::engine {

// An allgather's result, in elements: every name's rows from every rank.
size_t gathered_elements(const Response& r);

// Whether `r` may be fused with other responses at all.
bool fusable(const Response& r);

// The bytes `r` (one name, or several fused) counts against the fusion threshold: what an
// allgather returns, what the others take as input.
size_t fusion_bytes(const Response& r);

// Whether `next` (one name) may join `last` (fusable): same kind, set, dtype and what the kind
// must share.
bool fuses_with(const Response& last, const Response& next);

// Appends `next`'s name and layout to `last` (fuses_with(last, next)).
void append_fused(Response& last, const Response& next);

// Allreduces rank 0 did inline (control_inline.h) are merged the same way into one response whose
// result is theirs back to back: a small grouped allreduce (a pytree of scalars, a model's norms)
// then costs every rank one result to take apart instead of one response per tensor. Same rules as
// fuses_with for allreduces, on the job's set only.
bool inline_fuses_with(const Response& last, const Response& next);
void append_inline_fused(Response& last, const Response& next);  // inline_fuses_with(last, next)

}  // namespace nezha::engine
