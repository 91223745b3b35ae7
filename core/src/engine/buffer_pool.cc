#include "engine/buffer_pool.h"

#include <algorithm>

namespace nezha::engine {

BufferPool::Buffer BufferPool::acquire(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Smallest cached buffer that fits.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
    if (best != free_.end()) {
      cached_bytes_ -= best->first;
      Buffer b(this, std::move(best->second), best->first);
      free_.erase(best);
      return b;
    }
  }
  return Buffer(this, std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes);
}

void BufferPool::give_back(std::unique_ptr<uint8_t[]> mem, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace_back(capacity, std::move(mem));
  cached_bytes_ += capacity;
  while (!free_.empty() && (free_.size() > max_cached_ || cached_bytes_ > max_cached_bytes_)) {
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                     [](auto& a, auto& b) { return a.first < b.first; });
    cached_bytes_ -= smallest->first;
    free_.erase(smallest);
  }
}

}  // namespace nezha::engine
