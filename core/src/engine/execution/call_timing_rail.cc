#include "engine/execution/call_timing_rail.h"

#include <chrono>

namespace nezha::engine {
namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void CallTimingRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  const auto start = std::chrono::steady_clock::now();
  parent_.recv(peer, tag, data, bytes, deadline);
  calls_.push_back(seconds_since(start));
}

void CallTimingRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                                   int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                                   const Deadline& deadline) {
  const auto start = std::chrono::steady_clock::now();
  parent_.sendrecv_tags(send_peer, send_data, send_bytes, send_tag, recv_peer, recv_data, recv_bytes, recv_tag,
                        deadline);
  calls_.push_back(seconds_since(start));
}

}  // namespace nezha::engine
