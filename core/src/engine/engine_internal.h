// Internal to the engine's own .cc files (engine*.cc): the loop's constants and small helpers. No
// component includes it.
#pragma once

#include <chrono>
#include <string>

#include "common/deadline.h"
#include "engine/request.h"

namespace nezha::engine::internal {

inline constexpr const char* kJoinName = kJoinTensorName;
inline constexpr double kIdleWakeS = 1.0;  // the loop re-checks shutdown/stall state at least this often

inline Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

inline std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

}  // namespace nezha::engine::internal
