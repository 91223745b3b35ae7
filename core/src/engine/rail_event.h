// The events of rail failover and re-admission. Failover decides them (failover/rail_failover.h has
// the whole protocol) and negotiation carries them in its control messages (message_codec.h); both
// include this header, neither the other's.
#pragma once

#include <cstdint>
#include <string>

namespace nezha::engine {

// Workers report to rank 0 (kFailed, kDrained, kProbeReady, kProbeResult); rank 0 decides and tells
// everyone (kDown, kRedo, kProbe, kConnect, kProbeFailed, kUp) in the same ordered stream as the
// responses, so every rank changes a rail's state at the same point of its operation sequence.
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

}  // namespace nezha::engine
