#include "engine/execution/buffer_pool.h"

#include <algorithm>

namespace nezha::engine {

BufferPool::Buffer BufferPool::acquire(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Smallest cached buffer that fits.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
    if (best != free_.end()) {
      cached_bytes_ -= best->size();
      Buffer b(this, std::move(*best));
      free_.erase(best);
      return b;
    }
  }
  return Buffer(this, AlignedBuffer(bytes));
}

void BufferPool::give_back(AlignedBuffer mem) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_bytes_ += mem.size();
  free_.push_back(std::move(mem));
  while (!free_.empty() && (free_.size() > max_cached_ || cached_bytes_ > max_cached_bytes_)) {
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                     [](auto& a, auto& b) { return a.size() < b.size(); });
    cached_bytes_ -= smallest->size();
    free_.erase(smallest);
  }
}

}  // namespace nezha::engine
