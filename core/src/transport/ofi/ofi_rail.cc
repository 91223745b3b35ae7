#ifdef NEZHA_WITH_OFI
#include "transport/ofi/ofi_rail.h"
#include "transport/ofi/ofi_rail_internal.h"

#include <arpa/inet.h>
#include <rdma/fi_errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/ofi/ofi_address.h"
#include "transport/ofi/ofi_endpoint.h"

namespace nezha::transport {

using namespace ofi_detail;

OfiRail::OfiRail(OfiRailConfig config, int rank, int size)
    : config_(std::move(config)),
      rank_(rank),
      size_(size),
      reachable_(new std::atomic<bool>[size > 0 ? size : 0]()) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("OfiRail: rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  if (config_.chunk_bytes < kHandshakeMessageBytes || config_.window == 0)
    throw InvalidArgument("rail " + config_.name + ": chunk_bytes must be at least " +
                          std::to_string(kHandshakeMessageBytes) + " and window at least 1");
  ofi::EndpointConfig ec;
  ec.rail = config_.name;
  ec.provider = config_.provider;
  ec.node = config_.node;
  ec.slot_bytes = config_.chunk_bytes;
  ec.slots = 2 * config_.window;  // a sendrecv keeps a window in flight each way
  endpoint_ = std::make_unique<ofi::OfiEndpoint>(ec);
  local_address_ = ofi::encode_address({endpoint_->provider_name(), endpoint_->name()});
  ops_.resize(endpoint_->slots());
  for (size_t i = 0; i < ops_.size(); ++i) {
    ops_[i].slot = i;
    free_slots_.push_back(ops_.size() - 1 - i);
  }
  peer_addr_.assign(static_cast<size_t>(size), FI_ADDR_UNSPEC);
  closed_reason_.assign(static_cast<size_t>(size), "");
  peer_raw_.assign(static_cast<size_t>(size), "");
  abort_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (abort_fd_ < 0 || wake_fd_ < 0) {
    if (abort_fd_ >= 0) ::close(abort_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    throw NezhaError("rail " + config_.name + ": eventfd() failed");
  }

  properties_.name = config_.name;
  properties_.kind = "ofi";
  properties_.local_addr = endpoint_->provider_name() + (config_.node.empty() ? "" : "@" + config_.node);
  properties_.reach = RailReach::kJob;
  properties_.max_share_bytes = config_.max_share_bytes;
  in_addr ip{};
  if (inet_pton(AF_INET, config_.node.c_str(), &ip) == 1) properties_.bind_ip = config_.node;  // not for shm
  buffered_sends_ = endpoint_->provider_name().find("ofi_rxm") != std::string::npos;
  progress_ = std::thread([this] { progress_loop(); });
}

OfiRail::~OfiRail() {
  close();
  ::close(abort_fd_);
  ::close(wake_fd_);
}

void OfiRail::progress_loop() {
  name_this_thread("nz-ofi-progress");
  Lock lk(fab_mu_);
  while (!stop_) {
    if (active_ || detached_sends_ == 0 || !endpoint_) {
      progress_cv_.wait(lk);
      continue;
    }
    try {
      reap(lk, Deadline::after_seconds(0.1), /*block=*/false);
      if (detached_sends_ == 0 || active_ || stop_) continue;
      endpoint_->wait(lk, wake_fd_, Deadline::after_seconds(0.1));
    } catch (const NezhaError& e) {
      // A completion-queue failure; the next data call meets it too and fails its operation. Pause so
      // a persistent error does not spin.
      NZ_LOG(Warning) << "rail " << config_.name << ": progress thread: " << e.what();
      progress_cv_.wait_for(lk, std::chrono::milliseconds(100));
    }
  }
}

void OfiRail::stop_progress() {
  {
    Lock lk(fab_mu_);
    stop_ = true;
  }
  progress_cv_.notify_all();
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof one) < 0) {
    // Only fails when the counter is already non-zero: the thread is woken anyway.
  }
  if (progress_.joinable()) progress_.join();
}

bool OfiRail::reaches(int peer) const {
  return peer >= 0 && peer < size_ && peer != rank_ && !aborted_.load(std::memory_order_acquire) &&
         reachable_[peer].load(std::memory_order_acquire);
}

RailCounters OfiRail::counters() const {
  return RailCounters{bytes_sent_.load(std::memory_order_relaxed), bytes_received_.load(std::memory_order_relaxed)};
}

void OfiRail::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  const uint64_t one = 1;
  if (::write(abort_fd_, &one, sizeof one) < 0) {
    // Only fails on counter overflow, i.e. the eventfd is already readable.
  }
}

void OfiRail::throw_if_aborted() const {
  if (!aborted_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw NezhaError("rail " + config_.name + " aborted: " + abort_reason_);
}

uint64_t OfiRail::data_tag(uint64_t tag, bool last) const {
  if (tag >= kUserTagLimit)
    throw InvalidArgument("rail " + config_.name + ": tag " + format_tag(tag) + " does not fit the ofi rail's 56 tag bits");
  return ((epoch_ & kEpochMask) << kEpochShift) | tag | (last ? kLastChunkBit : 0);
}

void OfiRail::check_peer(int peer, const char* what) const {
  throw_if_aborted();
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw InvalidArgument("rail " + config_.name + ": cannot " + what + " rank " + std::to_string(peer) +
                          " from rank " + std::to_string(rank_) + " of " + std::to_string(size_));
  if (!closed_reason_[peer].empty())
    throw PeerError(peer, "rail " + config_.name + ": no connection to rank " + std::to_string(peer) +
                              ": closed after an earlier error: " + closed_reason_[peer]);
  if (peer_addr_[peer] == FI_ADDR_UNSPEC)
    throw PeerError(peer, "rail " + config_.name + ": no connection to rank " + std::to_string(peer) +
                              ": connect() has not connected it");
}

void OfiRail::close_peer(int peer, const std::string& why) {
  if (closed_reason_[peer].empty()) closed_reason_[peer] = why;
  reachable_[peer].store(false, std::memory_order_release);
  NZ_LOG(Debug) << why;
}

void OfiRail::post(Stream& s) {
  const fi_addr_t addr = peer_addr_[s.peer];
  while (s.error.empty() && s.posted < s.chunks && s.in_flight < config_.window && !free_slots_.empty() &&
         (s.is_recv || sends_busy_ < config_.window)) {
    const size_t slot = free_slots_.back();
    const size_t offset = s.posted * config_.chunk_bytes;
    const size_t len = s.exact ? std::min(config_.chunk_bytes, s.bytes - offset) : s.bytes;
    const bool last = s.posted + 1 == s.chunks;
    Op& op = ops_[slot];
    ssize_t rc;
    if (s.is_recv) {
      rc = endpoint_->post_recv(slot, len, addr, s.wire_tag | (s.exact && last ? kLastChunkBit : 0),
                                s.exact ? kLastChunkBit : 0, &op.context);
    } else {
      if (len) std::memcpy(endpoint_->slot(slot), s.data + offset, len);
      rc = endpoint_->post_send(slot, len, addr, s.wire_tag | (s.exact && last ? kLastChunkBit : 0), &op.context);
    }
    if (rc == -FI_EAGAIN) return;  // the provider's queue is full: progress first
    if (rc != 0) {
      s.error = "rail " + config_.name + ": posting a " + (s.is_recv ? "receive from" : "send to") + " rank " +
                std::to_string(s.peer) + " failed (tag " + format_tag(s.tag) + "): " + ofi::OfiEndpoint::error_text(rc);
      return;
    }
    free_slots_.pop_back();
    op.busy = true;
    op.owner = &s;
    op.is_recv = s.is_recv;
    op.last = last;
    op.peer = s.peer;
    if (!s.is_recv) ++sends_busy_;
    op.chunk = s.posted;
    op.offset = offset;
    op.bytes = len;
    ++s.posted;
    ++s.in_flight;
    // Sent once handed to the provider, as the TCP rail counts bytes written into its socket buffer:
    // a buffered send's completion may come after the caller has moved on (tests compare the totals).
    if (!s.is_recv) bytes_sent_.fetch_add(len, std::memory_order_relaxed);
  }
}

void OfiRail::reap(Lock& lk, const Deadline& deadline, bool block) {
  std::vector<ofi::Completion> done;
  endpoint_->poll_completions(done);
  if (done.empty() && block) {
    endpoint_->wait(lk, abort_fd_, deadline);
    endpoint_->poll_completions(done);
  }
  for (const ofi::Completion& c : done) {
    Op* op = static_cast<Op*>(c.context);
    if (op < ops_.data() || op >= ops_.data() + ops_.size() || !op->busy) {
      NZ_LOG(Warning) << "rail " << config_.name << ": completion for an unknown operation ignored";
      continue;
    }
    Stream* s = op->owner;
    op->busy = false;
    op->owner = nullptr;
    if (!op->is_recv) --sends_busy_;
    if (op->drain_pattern >= 0) {  // a stale message of an earlier epoch, discarded (drain_stale_epoch)
      drain_patterns_posted_ &= ~(1u << op->drain_pattern);
      op->drain_pattern = -1;
      if (!c.error) last_drained_ = Clock::now();
    }
    if (!s && !op->is_recv) {  // a detached send: nobody waits for it, so its failure closes the peer
      --detached_sends_;
      if (c.error)
        close_peer(op->peer, "rail " + config_.name + ": a buffered send to rank " + std::to_string(op->peer) +
                                 " failed: " + c.error_text);
    }
    if (s) {
      --s->in_flight;
      const std::string who = std::string(op->is_recv ? "receiving from" : "sending to") + " rank " +
                              std::to_string(s->peer) + " (tag " + format_tag(s->tag) + ")";
      if (c.error) {
        if (s->error.empty()) {
          s->error = "rail " + config_.name + ": " + who + " failed: " + c.error_text;
          s->protocol_error = c.error == FI_ETRUNC;
          if (c.error == FI_ETRUNC)
            s->error = "rail " + config_.name + ": " + who + ": a message longer than the " +
                       std::to_string(op->bytes) + " bytes expected in chunk " + std::to_string(op->chunk) +
                       " arrived (the sizes of the two sides differ)";
        }
      } else if (op->is_recv && s->exact && (c.length != op->bytes || bool(c.tag & kLastChunkBit) != op->last)) {
        if (s->error.empty()) {
          s->protocol_error = true;
          s->error = "rail " + config_.name + ": " + who + ": chunk " + std::to_string(op->chunk) + " has " +
                     std::to_string(c.length) + " bytes" + (bool(c.tag & kLastChunkBit) ? " and ends" : "") +
                     " where " + std::to_string(op->bytes) + (op->last ? " ending " : " ") + "the " +
                     std::to_string(s->bytes) + "-byte message were expected (the sizes of the two sides differ)";
        }
      } else {
        if (op->is_recv) {
          if (c.length) std::memcpy(s->data + op->offset, endpoint_->slot(op->slot), c.length);
          s->received += c.length;
          bytes_received_.fetch_add(c.length, std::memory_order_relaxed);
        }
        ++s->done;
      }
    }
    free_slots_.push_back(op->slot);
  }
}

void OfiRail::orphan(Stream& s) {
  for (Op& op : ops_) {
    if (!op.busy || op.owner != &s) continue;
    op.owner = nullptr;
    // A receive left posted would swallow a later message; a send cannot be recalled, its slot
    // comes back when the provider completes it (driven by the progress thread from now on).
    if (op.is_recv)
      endpoint_->cancel(&op.context);
    else
      ++detached_sends_;
  }
  s.in_flight = 0;
}

void OfiRail::transfer(Lock& lk, Stream* out, Stream* in, const Deadline& deadline) {
  const auto start = Clock::now();
  Driving driving(this);
  if (out && out->exact && out->bytes <= send_buffer_bytes()) out->buffered = true;
  Stream* streams[2] = {out, in};
  // Whatever way this returns, no posted chunk may keep pointing at these stack objects.
  struct Orphaner {
    OfiRail* rail;
    Stream** streams;
    ~Orphaner() {
      for (int i = 0; i < 2; ++i)
        if (streams[i] && streams[i]->in_flight) rail->orphan(*streams[i]);
    }
  } orphaner{this, streams};
  for (;;) {
    throw_if_aborted();
    for (Stream* s : streams)
      if (s) post(*s);
    for (Stream* s : streams) {
      if (!s || s->error.empty()) continue;
      close_peer(s->peer, s->error);
      if (s->protocol_error) throw ProtocolError(s->error);
      throw PeerError(s->peer, s->error);
    }
    const bool sending = out && !out->finished();
    const bool receiving = in && !in->finished();
    if (!sending && !receiving) return;
    if (deadline.expired()) {
      const Stream& s = receiving ? *in : *out;
      const std::string what = "rail " + config_.name + ": timed out after " + seconds_since(start) +
                               " s waiting for rank " + std::to_string(s.peer) + " (tag " + format_tag(s.tag) +
                               "); " + std::to_string(s.done) + " of " + std::to_string(s.chunks) + " chunks " +
                               (receiving ? "received" : "sent");
      if (sending) close_peer(out->peer, what);
      if (receiving) close_peer(in->peer, what);
      throw TimeoutError(s.peer, what);
    }
    reap(lk, deadline, /*block=*/true);
  }
}

void OfiRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  Lock lk(fab_mu_);
  check_peer(peer, "send to");
  if (!reachable_[peer]) throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream s(false, peer, tag, data_tag(tag, false), const_cast<void*>(data), bytes, config_.chunk_bytes);
  transfer(lk, &s, nullptr, deadline);
}

void OfiRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  Lock lk(fab_mu_);
  check_peer(peer, "receive from");
  if (!reachable_[peer]) throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream s(true, peer, tag, data_tag(tag, false), data, bytes, config_.chunk_bytes);
  transfer(lk, nullptr, &s, deadline);
}

void OfiRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                            int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                            const Deadline& deadline) {
  Lock lk(fab_mu_);
  check_peer(send_peer, "send to");
  check_peer(recv_peer, "receive from");
  for (int peer : {send_peer, recv_peer})
    if (!reachable_[peer])
      throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream out(false, send_peer, send_tag, data_tag(send_tag, false), const_cast<void*>(send_data), send_bytes,
             config_.chunk_bytes);
  Stream in(true, recv_peer, recv_tag, data_tag(recv_tag, false), recv_data, recv_bytes, config_.chunk_bytes);
  transfer(lk, &out, &in, deadline);
}

}  // namespace nezha::transport
#endif  // NEZHA_WITH_OFI
