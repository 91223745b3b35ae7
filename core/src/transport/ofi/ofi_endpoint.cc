#ifdef NEZHA_WITH_OFI
#include "transport/ofi/ofi_endpoint.h"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "common/error.h"
#include "transport/ofi/ofi_library.h"
#include "transport/ofi/ofi_providers.h"

namespace nezha::transport::ofi {

namespace {

// FI_VERSION 1.9: mr_mode bits in the hints are honoured (1.5+), FI_CONTEXT2 exists.
constexpr uint32_t kApiVersion = FI_VERSION(1, 9);

std::string available_providers() {
  std::string out;
  for (const std::string& p : ofi_rdm_providers()) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "none" : out;
}

// fi_getinfo walks every provider libfabric has (psm, verbs, udp, ...): ~10 ms each time. A job
// opens each rail once, but tests open thousands; the answer for a (provider, node) pair does not
// change within a process, so it is kept and duplicated; freed at exit.
int cached_getinfo(const FabricLibrary& lib, fi_info* hints, const char* node, uint64_t flags,
                   const std::string& provider, fi_info** out) {
  struct Cache {
    std::mutex mu;
    std::map<std::pair<std::string, std::string>, fi_info*> entries;
    const FabricLibrary* lib = nullptr;
    ~Cache() {
      for (auto& [key, info] : entries) lib->freeinfo(info);
    }
  };
  static Cache cache;
  const auto key = std::make_pair(provider, std::string(node ? node : ""));
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.lib = &lib;
  auto it = cache.entries.find(key);
  if (it == cache.entries.end()) {
    fi_info* info = nullptr;
    const int rc = lib.getinfo(kApiVersion, node, nullptr, flags, hints, &info);
    if (rc != 0 || !info) return rc != 0 ? rc : -FI_ENODATA;
    it = cache.entries.emplace(key, info).first;
  }
  *out = lib.dupinfo(it->second);  // the first (preferred) match only
  return *out ? 0 : -FI_ENOMEM;
}

}  // namespace

std::string OfiEndpoint::error_text(ssize_t err) {
  const int e = static_cast<int>(err < 0 ? -err : err);
  const FabricLibrary* lib = try_fabric_library();
  return lib ? lib->strerror(e) : "libfabric error " + std::to_string(e);
}

void OfiEndpoint::fail(const std::string& call, ssize_t err) const {
  throw NezhaError("rail " + config_.rail + " (ofi, provider " + config_.provider + "): " + call +
                   " failed: " + error_text(err));
}

OfiEndpoint::OfiEndpoint(EndpointConfig config)
    : config_(std::move(config)), lib_(&fabric_library(config_.rail)) {
  if (config_.slots == 0 || config_.slot_bytes == 0)
    throw InvalidArgument("rail " + config_.rail + ": the ofi staging pool needs slots and slot bytes");
  fi_info* hints = lib_->allocinfo();
  if (!hints) throw NezhaError("rail " + config_.rail + ": fi_allocinfo() failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;  // our contexts start with a struct fi_context2
  // What verbs needs; asked of every provider so the registration path is always the one exercised.
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  // Chunks of one message share a tag and must be matched in the order they were sent.
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->fabric_attr->prov_name = strdup(config_.provider.c_str());
  const char* node = config_.node.empty() ? nullptr : config_.node.c_str();
  const int rc = cached_getinfo(*lib_, hints, node, node ? FI_SOURCE : 0, config_.provider, &info_);
  lib_->freeinfo(hints);
  if (rc != 0 || !info_) {
    info_ = nullptr;
    throw NezhaError("rail " + config_.rail + ": libfabric has no usable provider '" + config_.provider +
                     "'" + (node ? " on " + config_.node : std::string()) +
                     " for RDM tagged messages (fi_getinfo: " + error_text(rc) +
                     "; RDM providers here: " + available_providers() + ")");
  }
  provider_name_ = info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : config_.provider;
  try {
    int err = lib_->fabric(info_->fabric_attr, &fabric_, nullptr);
    if (err) fail("fi_fabric", err);
    err = fi_domain(fabric_, info_, &domain_, nullptr);
    if (err) fail("fi_domain", err);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    err = fi_av_open(domain_, &av_attr, &av_, nullptr);
    if (err) fail("fi_av_open", err);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_FD;
    cq_attr.size = config_.slots * 4;
    err = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (err == 0) {
      err = fi_control(&cq_->fid, FI_GETWAIT, &cq_fd_);
      if (err) fail("fi_control(FI_GETWAIT)", err);
    } else {
      // Some providers (shm) have no wait object: wait() then sleeps in short slices (see there).
      cq_attr.wait_obj = FI_WAIT_NONE;
      cq_fd_ = -1;
      err = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
      if (err) fail("fi_cq_open", err);
    }
    err = fi_endpoint(domain_, info_, &ep_, nullptr);
    if (err) fail("fi_endpoint", err);
    err = fi_ep_bind(ep_, &av_->fid, 0);
    if (err) fail("fi_ep_bind(av)", err);
    err = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (err) fail("fi_ep_bind(cq)", err);
    err = fi_enable(ep_);
    if (err) fail("fi_enable", err);

    const size_t pool_bytes = config_.slots * config_.slot_bytes;
    pool_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (pool_bytes + 4095) / 4096 * 4096));
    if (!pool_) throw NezhaError("rail " + config_.rail + ": cannot allocate the ofi staging pool");
    err = fi_mr_reg(domain_, pool_, pool_bytes, FI_SEND | FI_RECV, 0, 0, 0, &mr_, nullptr);
    if (err) fail("fi_mr_reg of the " + std::to_string(pool_bytes) + "-byte staging pool", err);
    mr_desc_ = fi_mr_desc(mr_);
  } catch (...) {
    close_all();
    throw;
  }
}

OfiEndpoint::~OfiEndpoint() { close_all(); }

void OfiEndpoint::close_all() {
  // Endpoint first (it references the others), fabric last; the pool after its registration.
  if (ep_) fi_close(&ep_->fid);
  if (mr_) fi_close(&mr_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) lib_->freeinfo(info_);
  std::free(pool_);
  ep_ = nullptr, mr_ = nullptr, av_ = nullptr, cq_ = nullptr, domain_ = nullptr, fabric_ = nullptr;
  info_ = nullptr, pool_ = nullptr;
}

std::string OfiEndpoint::name() const {
  std::string raw(256, '\0');
  size_t len = raw.size();
  int err = fi_getname(&ep_->fid, raw.data(), &len);
  if (err == -FI_ETOOSMALL) {
    raw.assign(len, '\0');
    err = fi_getname(&ep_->fid, raw.data(), &len);
  }
  if (err) fail("fi_getname", err);
  raw.resize(len);
  return raw;
}

fi_addr_t OfiEndpoint::insert_address(const std::string& raw, int rank) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(av_, raw.data(), 1, &addr, 0, nullptr);
  if (n != 1)
    throw NezhaError("rail " + config_.rail + ": cannot add rank " + std::to_string(rank) +
                     "'s endpoint address to the address vector (fi_av_insert: " +
                     (n < 0 ? error_text(n) : std::string("address rejected")) + ")");
  return addr;
}

void OfiEndpoint::remove_address(fi_addr_t addr) {
  if (addr != FI_ADDR_UNSPEC) fi_av_remove(av_, &addr, 1, 0);
}

ssize_t OfiEndpoint::post_send(size_t slot_index, size_t bytes, fi_addr_t to, uint64_t tag, void* context) {
  return fi_tsend(ep_, slot(slot_index), bytes, mr_desc_, to, tag, context);
}

ssize_t OfiEndpoint::post_recv(size_t slot_index, size_t bytes, fi_addr_t from, uint64_t tag,
                               uint64_t ignore, void* context) {
  return fi_trecv(ep_, slot(slot_index), bytes, mr_desc_, from, tag, ignore, context);
}

void OfiEndpoint::cancel(void* context) { fi_cancel(&ep_->fid, context); }

size_t OfiEndpoint::poll_completions(std::vector<Completion>& out) {
  size_t got = 0;
  for (;;) {
    fi_cq_tagged_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) out.push_back({entries[i].op_context, entries[i].len, entries[i].tag, 0, {}});
      got += static_cast<size_t>(n);
      last_completion_ = Clock::now();
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e{};
      if (fi_cq_readerr(cq_, &e, 0) == 1) {
        char buf[256];
        const char* detail = fi_cq_strerror(cq_, e.prov_errno, e.err_data, buf, sizeof buf);
        std::string text = error_text(e.err);
        if (detail && *detail) text += std::string(" (") + detail + ")";
        out.push_back({e.op_context, e.len, e.tag, e.err ? e.err : FI_EOTHER, text});
        ++got;
        continue;
      }
      return got;
    }
    if (n == -FI_EAGAIN) return got;
    fail("fi_cq_read", n);
  }
}

void OfiEndpoint::wait(std::unique_lock<std::mutex>& lock, int wake_fd, const Deadline& deadline) {
  if (cq_fd_ < 0) {
    // No wait object: yield while completions came recently (a transfer in full flow), else sleep
    // 1 ms slices on the wake fd. Only a transfer in progress waits; an idle rail runs nothing.
    if (Clock::now() - last_completion_ < std::chrono::microseconds(200)) {
      lock.unlock();
      sched_yield();
      lock.lock();
      return;
    }
    pollfd fd{wake_fd, POLLIN, 0};
    lock.unlock();
    const int rc = ::poll(&fd, 1, std::min(1, deadline.remaining_ms()));
    const int poll_errno = errno;
    lock.lock();
    if (rc < 0 && poll_errno != EINTR)
      throw NezhaError("rail " + config_.rail + ": poll() failed: " + std::strerror(poll_errno));
    return;
  }
  fid* fids[1] = {&cq_->fid};
  // fi_trywait also drives progress; -FI_EAGAIN means something is (or may be) pending: go read it.
  if (fi_trywait(fabric_, fids, 1) != FI_SUCCESS) return;
  pollfd fds[2] = {{wake_fd, POLLIN, 0}, {cq_fd_, POLLIN, 0}};
  lock.unlock();
  const int rc = ::poll(fds, 2, deadline.remaining_ms());
  const int poll_errno = errno;
  lock.lock();
  if (rc < 0 && poll_errno != EINTR)
    throw NezhaError("rail " + config_.rail + ": poll() on the completion queue failed: " + std::strerror(poll_errno));
}

}  // namespace nezha::transport::ofi
#endif  // NEZHA_WITH_OFI
