// Small allreduces reduced by rank 0 inside negotiation, without a rail.
//
// Why: an allreduce of a few bytes costs the coordinator's round trip (request to rank 0, response
// back) and then log2(size) exchanges on a rail, and each of those steps is a thread wake-up on
// every rank; on a busy host a wake-up costs far more than moving the bytes (8 bytes, 4 ranks on 2
// cores: ~750 us, of which the rail's part is ~40%). So a rank sends a small allreduce's input with
// its request, rank 0 reduces the inputs in rank order and returns the result with the response:
// the two control hops negotiation needs anyway, and nothing else. The result is computed once, so
// it is bit-identical on every rank; the control channel's own failover covers a lost rail.
//
// How small: rank 0 receives at most NEZHA_CONTROL_REDUCE_BYTES for one tensor from all the other
// ranks together, so the limit per tensor shrinks as the job grows.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace nezha::engine {

// Most inline bytes (inputs in a request list, results in a response list) one control message
// carries; when many small tensors arrive at once the rest run on the rails. Keeps control messages
// small, and far below the transport's cap on one message.
constexpr size_t kControlReduceBytesPerMessage = size_t{1} << 20;

// Most bytes one rank's input may have to travel with its request (0 with one rank or limit 0).
size_t control_reduce_max_input_bytes(size_t limit_bytes, int size);

// Whether a rank sends req's input with it (a non-empty allreduce within the limit).
bool wants_inline_input(const Request& req, size_t limit_bytes, int size);

// Rank 0, before sending `responses` in one message: clears the results past
// kControlReduceBytesPerMessage (in order), so those tensors run on the rails instead.
void spill_inline_results(std::vector<Response>& responses);

// Rank 0: the result of `resp` (one allreduce tensor) from every rank's request in by_rank (nullopt:
// a joined rank, which contributes zeros), each scaled by the prescale, reduced in rank order, then
// multiplied by the effective postscale. Empty when some rank sent no input (or one of another size):
// the tensor then runs on the rails.
std::string reduce_inline_inputs(const Response& resp, const std::vector<std::optional<Request>>& by_rank);

}  // namespace nezha::engine
