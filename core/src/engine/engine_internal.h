// Internal to the engine's own .cc files (engine*.cc): the loop's constants and small helpers. No
// component includes it.
#pragma once

#include <chrono>
#include <string>

#include "common/deadline.h"
#include "engine/request.h"
#include "multirail/rail_table.h"
#include "transport/collective_rail.h"

namespace nezha::engine::internal {

inline constexpr const char* kJoinName = kJoinTensorName;
inline constexpr double kIdleWakeS = 1.0;  // the loop re-checks shutdown/stall state at least this often

inline Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

inline std::string rank_prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

// The transport's name of an operation the plan may give a collective rail (multirail::RailOp).
inline transport::CollectiveOp to_collective_op(multirail::RailOp op) {
  switch (op) {
    case multirail::RailOp::kBroadcast: return transport::CollectiveOp::kBroadcast;
    case multirail::RailOp::kAllgather: return transport::CollectiveOp::kAllgather;
    case multirail::RailOp::kReducescatter: return transport::CollectiveOp::kReducescatter;
    case multirail::RailOp::kAlltoall: return transport::CollectiveOp::kAlltoall;
    case multirail::RailOp::kNone: break;
  }
  return transport::CollectiveOp::kAllreduce;  // kNone never reaches a rail's runs()
}

}  // namespace nezha::engine::internal
