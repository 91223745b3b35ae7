// Requests and a start time for the coordinator's tests (coordinator_test.cc and its siblings).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "engine/negotiation/coordinator.h"

namespace nezha::engine::testing {

// A fixed "now" far from the clock's epoch, so tests can step it back and forth.
inline const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

inline Request allreduce(const std::string& name, std::vector<int64_t> shape = {4},
                         DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dtype;
  r.op = op;
  return r;
}

inline Request allgather(const std::string& name, std::vector<int64_t> shape) {
  Request r = allreduce(name, std::move(shape));
  r.type = OpType::kAllgather;
  return r;
}

}  // namespace nezha::engine::testing
