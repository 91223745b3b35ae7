// Binary encoding of control-channel messages (worker -> coordinator request lists, coordinator ->
// worker response lists, rank <-> rank cache-round vectors; the first byte tells them apart). Little-endian, every length checked against what remains, so a garbage
// or truncated message is a ProtocolError, never an out-of-bounds read or a huge allocation.
#pragma once

#include <string>
#include <vector>

#include "engine/rail_event.h"
#include "engine/request.h"
#include "multirail/cost_model.h"
#include "multirail/striping_check.h"

namespace nezha::engine {

// Longest tensor name (and error message) a control message carries.
constexpr size_t kMaxControlString = 1u << 16;

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;  // this rank is shutting down (after the requests above)
  std::vector<RailEvent> rail_events;
  // Per rail: shares this rank has completed (lets every rank drop the copies it keeps for redo).
  std::vector<uint64_t> completed;
  // This rank's allreduce times since its last message, for rank 0's striping check.
  std::vector<multirail::OperationTime> operation_times;
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;  // every rank asked to shut down: close now
  // Set when the job cannot go on (a rank is gone): every rank fails its pending work with it.
  std::string fatal;
  // The coordinator's cost model, so every rank reports the same alpha/beta (may be empty).
  std::vector<multirail::RailEstimate> estimates;
  // Handled before `responses`, in order.
  std::vector<RailEvent> rail_events;
  // Per rail: shares every rank has completed (minimum of the ranks' `completed`); may be empty.
  std::vector<uint64_t> watermark;
  // The last cache round rank 0 had started when it sent this list: every rank executes the list
  // after that round's operations and before the next round's (cache_rounds.h).
  uint64_t round = 0;
  // Rank 0's stall warnings, logged by every rank on arrival. A list carrying only these is not
  // executed and does not take part in the ordering above (is_notice_only).
  std::vector<std::string> notices;

  bool is_notice_only() const {
    return !notices.empty() && responses.empty() && !shutdown && fatal.empty() &&
           estimates.empty() && rail_events.empty() && watermark.empty();
  }
};

// One rank's vector in a cache round (cache_rounds.h), sent to every other rank.
struct RoundMessage {
  uint64_t round = 0;
  uint32_t join_gen = 0;            // 0: no join() in flight; else joins completed + 1 when joined
  std::vector<int32_t> pending;     // cache ids submitted and waiting, ascending
  std::vector<int32_t> invalidate;  // cache ids this rank re-submitted with other metadata
  std::vector<uint32_t> invalidate_versions;  // per id: the cache entry's version it saw
  std::vector<multirail::RailEstimate> estimates;  // rank 0 only: plans of this round use these
  // Not rank 0: this rank's allreduce times since its last message, for rank 0's striping check
  // (the copies to the other ranks leave them out).
  std::vector<multirail::OperationTime> operation_times;
};

std::string encode(const RequestList& list);
std::string encode(const ResponseList& list);
std::string encode(const RoundMessage& msg);
RequestList decode_request_list(const std::string& bytes);
ResponseList decode_response_list(const std::string& bytes);
RoundMessage decode_round_message(const std::string& bytes);
// True when the bytes are (claim to be) a RoundMessage: lets the engine route before decoding.
bool is_round_message(const std::string& bytes);

}  // namespace nezha::engine
