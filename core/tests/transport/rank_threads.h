// Test helper shared by the in-process rail meshes (tcp_mesh.h, shm_mesh.h): one std::thread per rank.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nezha::transport::testing {

// Runs fn(rank) on one thread per rank and rethrows the first exception any of them threw.
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace nezha::transport::testing
