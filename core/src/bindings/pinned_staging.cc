#include "bindings/pinned_staging.h"

#include <algorithm>
#include <iterator>

namespace nezha::bindings {
namespace {

constexpr unsigned kHostAllocPortable = 0x01;  // CU_MEMHOSTALLOC_PORTABLE: usable from any context

}  // namespace

PinnedStaging& PinnedStaging::get() {
  static PinnedStaging* pool = new PinnedStaging();  // leaked on purpose: no teardown after the driver's
  return *pool;
}

PinnedStaging::Lease PinnedStaging::acquire(const CudaDriver& cuda, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it)  // the smallest that fits
      if (it->second >= bytes) {
        Lease lease(this, it->first, it->second);
        idle_.erase(std::next(it).base());
        return lease;
      }
  }
  void* p = nullptr;
  cuda.check(cuda.mem_host_alloc(&p, bytes, kHostAllocPortable), "cuMemHostAlloc (staging)");
  return Lease(this, p, bytes);
}

void PinnedStaging::give_back(void* p, size_t bytes) {
  void* drop = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.emplace_back(p, bytes);
    std::sort(idle_.begin(), idle_.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    if (idle_.size() > kKept) {
      drop = idle_.back().first;
      idle_.pop_back();
    }
  }
  if (drop != nullptr) CudaDriver::get().mem_free_host(drop);  // portable: any context frees it
}

PinnedStaging::Lease::~Lease() {
  if (p_ != nullptr) pool_->give_back(p_, bytes_);
}

}  // namespace nezha::bindings
