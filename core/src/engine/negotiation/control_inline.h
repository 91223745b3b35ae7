// Small allreduces, broadcasts and allgathers done by rank 0 inside negotiation, without a rail.
//
// Why: a collective of a few bytes costs the coordinator's round trip (request to rank 0, response
// back) and then its exchanges on a rail (log2(size) rounds for an allreduce, a tree for a
// broadcast), and each of those steps is a thread wake-up on every rank; on a busy host a wake-up
// costs far more than moving the bytes (an 8-byte allreduce, 4 ranks on 2 cores: ~750 us, of which
// the rail's part is ~40%). So a rank sends a small input with its request, and rank 0 puts the
// result in its response: the allreduce's inputs reduced in rank order, the broadcast root's input,
// the allgather's inputs concatenated in rank order. The two control hops negotiation needs anyway,
// and nothing else. A result is computed once, so it is bit-identical on every rank; the control
// channel's own failover covers a lost rail.
//
// How small: rank 0 receives, and sends, at most NEZHA_CONTROL_INLINE_BYTES for one tensor: an input
// of up to limit / (ranks - 1) bytes per rank for an allreduce or a broadcast, limit / ((ranks - 1) x
// ranks) for an allgather (whose whole result goes to every rank), so the limits shrink as the job
// grows. Anything else (one rank's input missing or over the limit, a mismatch, more than a message's
// budget) runs on the rails.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/tensor_entry.h"

namespace nezha::engine {

// Most inline bytes (inputs in a request list, results in a response list) one control message
// carries; when many small tensors arrive at once the rest run on the rails. Keeps control messages
// small, and far below the transport's cap on one message.
constexpr size_t kControlInlineBytesPerMessage = size_t{1} << 20;

// Most bytes one rank's allreduce or broadcast input may travel with its request (0 with one rank
// or limit 0).
size_t control_inline_max_input_bytes(size_t limit_bytes, int size);

// Whether `rank` sends req's input with it: a non-empty allreduce or allgather input within its
// limit (see above), or a broadcast's on its root.
bool wants_inline_input(const Request& req, size_t limit_bytes, int rank, int size);

// Rank 0, a cheap test before building a response: whether every input its result needs came with
// the requests in by_rank (the root's for a broadcast; every submitting rank's otherwise).
bool inline_inputs_arrived(const std::vector<std::optional<Request>>& by_rank);

// Rank 0, before sending `responses` in one message: clears the results past
// kControlInlineBytesPerMessage (in order), so those tensors run on the rails instead.
void spill_inline_results(std::vector<Response>& responses);

// The allreduce of `inputs` (one per rank, in rank order; nullptr: a joined rank's zeros), each
// scaled by `prescale`, reduced in rank order and multiplied by `postscale` (the effective one),
// into `out` (count elements). Rank 0's inline results and the host votes (host_vote.h) both use
// it, so a small allreduce has the same bits whichever way it went.
void reduce_in_rank_order(const std::vector<const void*>& inputs, int64_t count, DataType dtype, ReduceOp op,
                          double prescale, double postscale, void* out);

// Rank 0: the result of `resp` (one tensor, kExecute) from the ranks' requests in by_rank, or empty
// when some rank that must send its input did not (or sent one of another size): the tensor then
// runs on the rails. Allreduce: every rank's input (nullopt: a joined rank, zeros) scaled by the
// prescale, reduced in rank order, multiplied by the effective postscale. Broadcast: the root's
// input. Allgather: every rank's input, in rank order.
std::string inline_result_of(const Response& resp, const std::vector<std::optional<Request>>& by_rank);

// Every rank: copies resp's inline result to its tensors (entries[i] for resp.names[i]; no handle:
// a joined rank) and completes their handles, telling `on_done` each name and its bytes. Throws
// ProtocolError when the result does not have the size the response implies.
void deliver_inline_result(const Response& resp, std::vector<TensorEntry>& entries,
                           const std::function<void(const std::string& name, size_t bytes)>& on_done);

}  // namespace nezha::engine
