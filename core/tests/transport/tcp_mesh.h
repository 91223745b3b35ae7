// Test helpers: a full mesh of TcpRails in one process, one std::thread per rank, on 127.0.0.1.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rank_threads.h"
#include "transport/tcp/tcp_rail.h"

namespace nezha::transport::testing {

inline TcpRailConfig loopback_config(const std::string& secret = "test-secret") {
  TcpRailConfig c;
  c.name = "lo";
  c.local_addr = "127.0.0.1";
  c.secret = secret;
  c.socket_buffer_bytes = 1 << 20;
  return c;
}

inline std::vector<std::unique_ptr<TcpRail>> make_mesh(int n, TcpRailConfig config = loopback_config(),
                                                       double timeout_s = 10) {
  std::vector<std::unique_ptr<TcpRail>> rails;
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) {
    rails.push_back(std::make_unique<TcpRail>(config, r, n));
    addrs.push_back(rails.back()->local_address());
  }
  const Deadline deadline = Deadline::after_seconds(timeout_s);
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, deadline); });
  return rails;
}

// Deterministic bytes that differ per sender, message and position.
inline uint8_t pattern_byte(int sender, size_t message, size_t i) {
  return static_cast<uint8_t>((i * 131 + (i >> 8) * 7 + sender * 29 + message * 17) & 0xff);
}

inline std::vector<uint8_t> pattern(int sender, size_t message, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = pattern_byte(sender, message, i);
  return v;
}

// Index of the first byte that differs from pattern(sender, message, .), or -1.
inline long long first_mismatch(const std::vector<uint8_t>& got, int sender, size_t message) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != pattern_byte(sender, message, i)) return static_cast<long long>(i);
  return -1;
}

}  // namespace nezha::transport::testing
