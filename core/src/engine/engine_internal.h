// Internal to the engine's .cc files: constants and helpers the loop, negotiation and execution
// share. Not part of any interface.
#pragma once

#include <chrono>
#include <string>

#include "common/deadline.h"
#include "engine/request.h"

namespace nezha::engine::internal {

inline constexpr const char* kJoinName = kJoinTensorName;
inline constexpr double kIdleWakeS = 1.0;  // the loop re-checks shutdown/stall state at least this often
// Idle ranks exchange an empty control message this often, so a rank that stopped (SIGSTOP, a hung
// host) is told apart from one that has nothing to submit.
inline constexpr double kHeartbeatS = 1.0;
inline constexpr double kSwitchPathAfterS = 2.5 * kHeartbeatS;

inline Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

inline std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace nezha::engine::internal
