// Requests and a start time for the coordinator's tests (coordinator_test.cc and its siblings).
#pragma once

#include <gtest/gtest.h>

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

// Options of a coordinator for `size` ranks as the coordinator's tests use it: a 5 ms cycle, stall
// warnings only after a minute.
inline CoordinatorOptions options(int size) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_s = 0.005;
  o.stall_check_s = 60;
  return o;
}

// Every rank submits the same request list at time `now`.
inline void submit_all(Coordinator& c, int size, const std::vector<Request>& reqs, Clock::time_point now) {
  for (int r = 0; r < size; ++r) c.submit(r, reqs, now);
}

// The error every rank gets when rank r submits by_rank[r] (one tensor that differs somewhere).
inline std::string mismatch_error(const std::vector<Request>& by_rank) {
  Coordinator c(options(static_cast<int>(by_rank.size())));
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) c.submit(r, {by_rank[r]}, t0);
  auto out = c.take_ready(t0);
  if (out.size() != 1) return "expected exactly one response, got " + std::to_string(out.size());
  EXPECT_EQ(out[0].kind, Response::Kind::kError);
  EXPECT_EQ(out[0].names, std::vector<std::string>{by_rank[0].name});
  return out[0].error;
}

}  // namespace nezha::engine::testing
