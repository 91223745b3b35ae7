// Test helpers for the shm rail: a connected set of ShmRails in one process (one thread per rank),
// small rings so that tests reach the wrap-around and chunking paths with little data.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rank_threads.h"
#include "transport/shm/shm_rail.h"

namespace nezha::transport::testing {

inline ShmRailConfig small_ring_config(const std::string& secret = "shm-test-secret") {
  ShmRailConfig c;
  c.name = "shm-test";
  c.secret = secret;
  c.ring_bytes = 64 << 10;
  c.chunk_bytes = 16 << 10;
  c.liveness_slice_ms = 20;
  return c;
}

inline std::vector<std::string> addresses_of(const std::vector<std::unique_ptr<ShmRail>>& rails) {
  std::vector<std::string> addrs;
  for (const auto& r : rails) addrs.push_back(r->local_address());
  return addrs;
}

inline std::vector<std::unique_ptr<ShmRail>> make_shm_mesh(int n, ShmRailConfig config = small_ring_config(),
                                                           double timeout_s = 10) {
  std::vector<std::unique_ptr<ShmRail>> rails;
  for (int r = 0; r < n; ++r) rails.push_back(std::make_unique<ShmRail>(config, r, n));
  const auto addrs = addresses_of(rails);
  const Deadline deadline = Deadline::after_seconds(timeout_s);
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, deadline); });
  return rails;
}

}  // namespace nezha::transport::testing
