#ifdef NEZHA_WITH_OFI
#include "transport/ofi/ofi_rail.h"

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
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/ofi/ofi_address.h"
#include "transport/ofi/ofi_endpoint.h"

namespace nezha::transport {

namespace {

constexpr uint64_t kHandshakeBit = uint64_t{1} << 63;
constexpr uint64_t kLastChunkBit = uint64_t{1} << 62;
constexpr int kEpochShift = 56;
constexpr uint64_t kEpochMask = 0x3f;
constexpr uint64_t kUserTagLimit = uint64_t{1} << kEpochShift;
// A handshake message: one FrameType byte, then the auth.h payload.
constexpr size_t kHandshakeMessageBytes = 1 + kMaxHandshakePayloadBytes;

Deadline earlier(const Deadline& a, const Deadline& b) { return a.at() < b.at() ? a : b; }

std::string seconds_since(Clock::time_point start) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::chrono::duration<double>(Clock::now() - start).count());
  return buf;
}

std::string typed(FrameType type, const std::string& payload) {
  return std::string(1, static_cast<char>(type)) + payload;
}

}  // namespace

struct OfiRail::Stream {
  // exact: a data message of exactly `bytes`, in chunks of chunk_bytes; else one message of at most
  // `bytes` (handshake).
  Stream(bool is_recv, int peer, uint64_t tag, uint64_t wire_tag, void* data, size_t bytes, size_t chunk_bytes,
         bool exact = true)
      : is_recv(is_recv), peer(peer), tag(tag), wire_tag(wire_tag), data(static_cast<uint8_t*>(data)),
        bytes(bytes), exact(exact),
        chunks(exact ? std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes) : 1) {}
  bool is_recv;
  int peer;
  uint64_t tag;       // the caller's tag, named in errors
  uint64_t wire_tag;  // without kLastChunkBit
  uint8_t* data;
  size_t bytes;       // exact size, or the largest accepted (!exact: one chunk)
  bool exact;
  size_t chunks;
  size_t posted = 0, done = 0, in_flight = 0;
  size_t received = 0;   // bytes received so far (receives)
  std::string error;     // the first failure; empty while fine
  bool protocol_error = false;
  bool finished() const { return done == chunks; }
};

struct OfiRail::Op {
  fi_context2 context;  // first: a completion's op_context points here, i.e. at the Op
  size_t slot = 0;
  bool busy = false;        // posted and not yet completed (the slot is the provider's)
  Stream* owner = nullptr;  // null once the stream gave up on it (orphan)
  bool is_recv = false;
  bool last = false;
  size_t chunk = 0, offset = 0, bytes = 0;
};

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
  if (abort_fd_ < 0) throw NezhaError("rail " + config_.name + ": eventfd() failed");

  properties_.name = config_.name;
  properties_.kind = "ofi";
  properties_.local_addr = endpoint_->provider_name() + (config_.node.empty() ? "" : "@" + config_.node);
  properties_.reach = RailReach::kJob;
  properties_.max_share_bytes = config_.max_share_bytes;
  in_addr ip{};
  if (inet_pton(AF_INET, config_.node.c_str(), &ip) == 1) properties_.bind_ip = config_.node;  // not for shm
}

OfiRail::~OfiRail() {
  close();
  if (abort_fd_ >= 0) ::close(abort_fd_);
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
  while (s.error.empty() && s.posted < s.chunks && s.in_flight < config_.window && !free_slots_.empty()) {
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
    op.chunk = s.posted;
    op.offset = offset;
    op.bytes = len;
    ++s.posted;
    ++s.in_flight;
  }
}

void OfiRail::reap(const Deadline& deadline, bool block) {
  std::vector<ofi::Completion> done;
  endpoint_->poll_completions(done);
  if (done.empty() && block) {
    endpoint_->wait(abort_fd_, deadline);
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
        } else {
          bytes_sent_.fetch_add(op->bytes, std::memory_order_relaxed);
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
    // comes back when the provider completes it.
    if (op.is_recv) endpoint_->cancel(&op.context);
  }
  s.in_flight = 0;
}

void OfiRail::transfer(Stream* out, Stream* in, const Deadline& deadline) {
  const auto start = Clock::now();
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
    reap(deadline, /*block=*/true);
  }
}

void OfiRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  check_peer(peer, "send to");
  if (!reachable_[peer]) throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream s(false, peer, tag, data_tag(tag, false), const_cast<void*>(data), bytes, config_.chunk_bytes);
  transfer(&s, nullptr, deadline);
}

void OfiRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  check_peer(peer, "receive from");
  if (!reachable_[peer]) throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream s(true, peer, tag, data_tag(tag, false), data, bytes, config_.chunk_bytes);
  transfer(nullptr, &s, deadline);
}

void OfiRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                            int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                            const Deadline& deadline) {
  check_peer(send_peer, "send to");
  check_peer(recv_peer, "receive from");
  for (int peer : {send_peer, recv_peer})
    if (!reachable_[peer])
      throw PeerError(peer, "rail " + config_.name + ": rank " + std::to_string(peer) + " is not connected");
  Stream out(false, send_peer, send_tag, data_tag(send_tag, false), const_cast<void*>(send_data), send_bytes,
             config_.chunk_bytes);
  Stream in(true, recv_peer, recv_tag, data_tag(recv_tag, false), recv_data, recv_bytes, config_.chunk_bytes);
  transfer(&out, &in, deadline);
}

void OfiRail::send_small(int peer, uint64_t wire_tag, const std::string& payload, const Deadline& deadline) {
  Stream s(false, peer, wire_tag, wire_tag, const_cast<char*>(payload.data()), payload.size(), 0, /*exact=*/false);
  transfer(&s, nullptr, deadline);
}

std::string OfiRail::recv_small(int peer, uint64_t wire_tag, size_t max_bytes, const Deadline& deadline) {
  std::string buf(max_bytes, '\0');
  Stream s(true, peer, wire_tag, wire_tag, buf.data(), max_bytes, 0, /*exact=*/false);
  transfer(nullptr, &s, deadline);
  buf.resize(s.received);
  return buf;
}

void OfiRail::handshake(int peer, const Deadline& deadline) {
  const Deadline step = earlier(deadline, Deadline::after_seconds(config_.handshake_timeout_s));
  const HandshakeParams params{config_.secret, rank_, size_, config_.rail_index};
  auto tag = [&](uint64_t n) { return kHandshakeBit | ((epoch_ & kEpochMask) << kEpochShift) | n; };
  auto expect = [&](uint64_t n, std::initializer_list<FrameType> types) {
    const std::string m = recv_small(peer, tag(n), kHandshakeMessageBytes, step);
    const FrameType type = m.empty() ? FrameType{} : static_cast<FrameType>(m[0]);
    if (std::find(types.begin(), types.end(), type) == types.end())
      throw ProtocolError(std::string("got a ") + frame_type_name(type) + " message where a " +
                          frame_type_name(*types.begin()) + " was expected");
    return std::make_pair(type, m.substr(1));
  };
  auto refuse = [&](uint64_t n) {  // tell the peer why we hang up, so its error names the problem too
    try {
      send_small(peer, tag(n), typed(FrameType::kAuthResult, auth_result_payload(false)),
                 earlier(deadline, Deadline::after_seconds(0.5)));
    } catch (const NezhaError&) {
    }
  };
  if (rank_ > peer) {  // connector
    ConnectorHandshake hs(params, peer);
    send_small(peer, tag(1), typed(FrameType::kHello, hs.hello()), step);
    std::string response;
    try {
      response = hs.on_challenge(expect(2, {FrameType::kChallenge}).second);
    } catch (const AuthenticationError&) {
      refuse(3);
      throw;
    }
    send_small(peer, tag(3), typed(FrameType::kAuthResponse, response), step);
    hs.on_result(expect(4, {FrameType::kAuthResult}).second);
  } else {  // acceptor
    AcceptorHandshake hs(params);
    const std::string challenge = hs.on_hello(expect(1, {FrameType::kHello}).second);
    if (hs.peer_rank() != peer)
      throw AuthenticationError("hello from the address of rank " + std::to_string(peer) + " claims rank " +
                                std::to_string(hs.peer_rank()));
    send_small(peer, tag(2), typed(FrameType::kChallenge, challenge), step);
    try {
      const auto [type, payload] = expect(3, {FrameType::kAuthResponse, FrameType::kAuthResult});
      hs.on_response(type, payload);
    } catch (const AuthenticationError&) {
      refuse(4);
      throw;
    }
    send_small(peer, tag(4), typed(FrameType::kAuthResult, auth_result_payload(true)), step);
  }
}

void OfiRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument("rail " + config_.name + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_aborted();
  if (!endpoint_) throw NezhaError("rail " + config_.name + " is closed");
  std::vector<std::string> failures;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || (peer_addr_[peer] != FI_ADDR_UNSPEC && peer_raw_[peer] == addresses_by_rank[peer]))
      continue;
    try {
      const ofi::OfiAddress a = ofi::decode_address(addresses_by_rank[peer], peer, config_.name);
      if (a.provider != endpoint_->provider_name())
        throw ProtocolError("rank " + std::to_string(peer) + " opened provider '" + a.provider + "', rank " +
                            std::to_string(rank_) + " opened '" + endpoint_->provider_name() + "'");
      endpoint_->remove_address(peer_addr_[peer]);  // a peer that came back at a new address
      peer_addr_[peer] = endpoint_->insert_address(a.raw, peer);
      peer_raw_[peer] = addresses_by_rank[peer];
    } catch (const NezhaError& e) {
      close_peer(peer, e.what());
      failures.push_back(e.what());
    }
  }
  // Every rank walks its pairs in the same global order (lower rank first), so no cycle of waits.
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !closed_reason_[peer].empty() || reachable_[peer]) continue;
    try {
      handshake(peer, deadline);
      reachable_[peer].store(true, std::memory_order_release);
    } catch (const NezhaError& e) {
      throw_if_aborted();
      const std::string why = "handshake with rank " + std::to_string(peer) + " failed: " + e.what();
      close_peer(peer, why);
      failures.push_back(why);
    }
  }
  if (!failures.empty()) {
    std::ostringstream msg;
    msg << "rail " << config_.name << ": rank " << rank_ << " could not connect to all ranks: ";
    for (size_t i = 0; i < failures.size(); ++i) msg << (i ? "; " : "") << failures[i];
    throw NezhaError(msg.str());
  }
}

void OfiRail::reset() {
  if (!endpoint_) return;
  for (Op& op : ops_) {
    if (!op.busy) continue;
    op.owner = nullptr;
    if (op.is_recv) endpoint_->cancel(&op.context);
  }
  // The address vector keeps its entries: re-admission connects to the same addresses, the epoch
  // keeps a straggler of the old mesh from matching, and the providers re-form a broken connection
  // on the next send (removing and re-inserting confuses the shm provider's directed receives).
  for (int peer = 0; peer < size_; ++peer) {
    reachable_[peer].store(false, std::memory_order_release);
    closed_reason_[peer].clear();
  }
  uint64_t drained;
  while (::read(abort_fd_, &drained, sizeof drained) > 0) {
  }
  // Reap what the cancellations and dropped connections complete, so the slots come back.
  const Deadline drain = Deadline::after_seconds(1);
  while (free_slots_.size() < ops_.size() && !drain.expired()) reap(drain, /*block=*/true);
  if (free_slots_.size() < ops_.size())
    NZ_LOG(Warning) << "rail " << config_.name << ": " << ops_.size() - free_slots_.size()
                    << " staging slots still held by the provider after reset; they return when it completes them";
  epoch_ = (epoch_ + 1) & kEpochMask;
  std::lock_guard<std::mutex> lock(mu_);
  abort_reason_.clear();
  aborted_.store(false, std::memory_order_release);
}

void OfiRail::close() {
  abort("rail closed");
  for (int peer = 0; peer < size_; ++peer) reachable_[peer].store(false, std::memory_order_release);
  endpoint_.reset();  // closing the endpoint discards whatever is still posted
}

}  // namespace nezha::transport
#endif  // NEZHA_WITH_OFI
