// Binary encoding of control-channel messages (worker -> coordinator request lists, coordinator ->
// worker response lists, rank <-> rank cache-round vectors; the first byte tells them apart). Little-endian, every length checked against what remains, so a garbage
// or truncated message is a ProtocolError, never an out-of-bounds read or a huge allocation.
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"
#include "multirail/cost_model.h"

namespace nezha::engine {

// Longest tensor name (and error message) a control message carries.
constexpr size_t kMaxControlString = 1u << 16;

// Rail failover and re-admission (engine/failover/rail_failover.h has the whole protocol). Workers report to rank
// 0 (kFailed, kDrained, kProbeReady, kProbeResult); rank 0 decides and tells everyone (kDown, kRedo,
// kProbe, kConnect, kProbeFailed, kUp) in the same ordered stream as the responses, so every rank
// changes a rail's state at the same point of its operation sequence.
enum class RailEventKind : uint8_t {
  kFailed = 0,       // worker -> 0: this rank saw the rail fail (text: why; value: 0 for an error,
                     // 1 + the operation's sequence number for a stall)
  kDown = 1,         // 0 -> all: stop using the rail, abort it, report how far it got (text: why)
  kDrained = 2,      // worker -> 0: rail aborted and idle; value: shares completed on it
  kRedo = 3,         // 0 -> all: redo shares with seq >= value on rail `target`
  kProbe = 4,        // 0 -> all: reset the rail's connections for a re-admission attempt
  kProbeReady = 5,   // worker -> 0: reset done
  kConnect = 6,      // 0 -> all: reconnect and run a test allreduce
  kProbeResult = 7,  // worker -> 0: value 1 = reconnected and tested, 0 = failed (text: why)
  kProbeFailed = 8,  // 0 -> all: the attempt failed somewhere; abort the rail again
  kUp = 9,           // 0 -> all: the rail carries traffic again
  kQuery = 10,       // 0 -> all: a rank saw the rail stall in operation `value`: where are you?
  kQueryReply = 11,  // worker -> 0: value 1 = this rank has not reached that operation yet
};
constexpr int kNumRailEventKinds = 12;

struct RailEvent {
  RailEventKind kind = RailEventKind::kFailed;
  int32_t rail = 0;
  int32_t target = -1;  // kRedo: the rail that takes over; kQueryReply: 1 = behind (value: the seq)
  uint64_t value = 0;
  std::string text;
};

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;  // this rank is shutting down (after the requests above)
  std::vector<RailEvent> rail_events;
  // Per rail: shares this rank has completed (lets every rank drop the copies it keeps for redo).
  std::vector<uint64_t> completed;
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
