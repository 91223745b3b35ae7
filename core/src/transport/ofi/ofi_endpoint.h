// OfiEndpoint: the libfabric objects one ofi rail owns (fabric, domain, address vector, completion
// queue, RDM endpoint) and its registered staging pool. Internal to the ofi rail (ofi_rail.h).
//
// Why a staging pool. Verbs needs every buffer it sends from or receives into registered
// (FI_MR_LOCAL), and registering the caller's buffers per operation costs a system call and a page
// pin each time. The rail instead registers one pool of fixed-size slots once, at construction, and
// copies each chunk through a slot; at the 1-100 Gbit/s rails Nezha targets, a memcpy is far faster
// than the wire. The memory-registration modes verbs needs are requested from every provider (also
// tcp and shm), so this path is the one CI runs.
//
// Waiting. The completion queue has a file-descriptor wait object: wait() blocks in poll() on it and
// on the rail's abort eventfd after fi_trywait() says sleeping is safe, so an idle rail burns no CPU.
// A provider without one (shm in libfabric 1.17) gets a CQ without a wait object, and a waiting data
// call yields while completions flow and otherwise sleeps in 1 ms slices.
//
// Threads. Calls come from the rail's data thread and its progress thread, serialised by the rail's
// lock (the FI_THREAD_DOMAIN model); nothing here is called from abort().
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace nezha::transport::ofi {

struct FabricLibrary;

struct EndpointConfig {
  std::string rail;       // rail name, for error messages
  std::string provider;   // libfabric provider string, e.g. "tcp;ofi_rxm", "verbs;ofi_rxm", "shm"
  std::string node;       // local address to bind (IPv4); empty for providers that take none (shm)
  size_t slot_bytes = 1 << 20;
  size_t slots = 16;
};

// One completed (or failed) operation, as read from the completion queue.
struct Completion {
  void* context = nullptr;  // the context the operation was posted with
  size_t length = 0;        // bytes received (receives only)
  uint64_t tag = 0;         // the matched message's tag (receives only)
  int error = 0;            // 0, or a positive libfabric error number (FI_ETRUNC, FI_ECANCELED, ...)
  std::string error_text;   // fi_strerror / provider text when error != 0
};

class OfiEndpoint {
 public:
  // Opens every object and registers the pool. Throws NezhaError naming the rail and provider when
  // libfabric has no such provider (listing the ones it has) or an object cannot be opened.
  explicit OfiEndpoint(EndpointConfig config);
  ~OfiEndpoint();
  OfiEndpoint(const OfiEndpoint&) = delete;
  OfiEndpoint& operator=(const OfiEndpoint&) = delete;

  const std::string& provider_name() const { return provider_name_; }  // as libfabric names it
  std::string name() const;  // fi_getname(): the raw endpoint address bytes

  fi_addr_t insert_address(const std::string& raw, int rank);  // throws NezhaError naming the rank
  void remove_address(fi_addr_t addr);                         // best effort

  // Slot i of the staging pool: slot_bytes() bytes, registered.
  uint8_t* slot(size_t i) { return pool_ + i * config_.slot_bytes; }
  size_t slot_bytes() const { return config_.slot_bytes; }
  size_t slots() const { return config_.slots; }

  // Post one tagged message from / into slot `slot`. Return 0, -FI_EAGAIN (retry after progress) or
  // another negative libfabric error.
  ssize_t post_send(size_t slot, size_t bytes, fi_addr_t to, uint64_t tag, void* context);
  ssize_t post_recv(size_t slot, size_t bytes, fi_addr_t from, uint64_t tag, uint64_t ignore,
                    void* context);
  void cancel(void* context);  // best effort; the operation then completes with FI_ECANCELED

  // Appends the completions available now (never blocks); returns how many.
  size_t poll_completions(std::vector<Completion>& out);
  // Sleeps until the completion queue may have something, wake_fd is readable, or the deadline
  // passes; returns at once if a completion is already pending. `lock` (the rail's libfabric lock,
  // held on entry and on return) is released only while sleeping in poll().
  void wait(std::unique_lock<std::mutex>& lock, int wake_fd, const Deadline& deadline);

  static std::string error_text(ssize_t err);  // fi_strerror of a (negative or positive) error

 private:
  [[noreturn]] void fail(const std::string& call, ssize_t err) const;
  void close_all();

  EndpointConfig config_;
  const FabricLibrary* lib_;  // libfabric, loaded (ofi_library.h)
  std::string provider_name_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_mr* mr_ = nullptr;
  void* mr_desc_ = nullptr;
  int cq_fd_ = -1;  // the completion queue's wait fd (not owned); -1 if the provider has none
  Clock::time_point last_completion_{};
  uint8_t* pool_ = nullptr;  // page-aligned, slots() * slot_bytes() bytes, registered as mr_
};

}  // namespace nezha::transport::ofi
