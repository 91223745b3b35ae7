// ShmRail's data path: messages through the rings (inline) or read straight from the sender's
// buffer (direct), and the wait loop shared by send, recv and sendrecv (spin, then the doorbell
// futex in slices with liveness checks; shm_ring.h has the protocol).
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/shm/shm_rail.h"

namespace nezha::transport {

using shm::MessageHeader;
using shm::MessageMode;

struct ShmRail::Outgoing {
  int peer;
  MessageHeader header;
  const uint8_t* data;
  bool header_sent = false;
  size_t sent = 0;
  uint64_t direct_ack = 0;  // kDirect: the direct_done count that says the receiver has read it
  bool direct() const { return header.mode == MessageMode::kDirect; }
};

struct ShmRail::Incoming {
  int peer;
  uint64_t tag;
  uint8_t* data;
  size_t bytes;
  bool header_seen = false;
  bool direct = false;
  uint64_t source = 0;
  size_t received = 0;
  bool done() const { return header_seen && received == bytes; }
};

bool ShmRail::send_done(const Outgoing& out) const {
  if (!out.header_sent) return false;
  if (!out.direct()) return out.sent == out.header.bytes;
  return links_[out.peer].out.control->direct_done.load(std::memory_order_seq_cst) >= out.direct_ack;
}

bool ShmRail::send_can_progress(const Outgoing& out) const {
  if (send_done(out)) return true;
  if (out.header_sent && out.direct()) return false;
  return links_[out.peer].out.free_bytes() >= (out.header_sent ? 1 : sizeof(MessageHeader));
}

bool ShmRail::recv_can_progress(const Incoming& in) const {
  if (in.header_seen && in.direct) return true;  // the copy is ours to make
  return links_[in.peer].in.readable_bytes() >= (in.header_seen ? 1 : sizeof(MessageHeader));
}

bool ShmRail::step_send(Outgoing& out) {
  Link& l = links_[out.peer];
  shm::RingEnd& ring = l.out;
  bool progressed = false;
  if (!out.header_sent) {
    // Larger than the ring: it cannot be buffered anyway (send_buffer_bytes), so if the receiver
    // can read our memory it copies the payload itself, once.
    if (out.header.bytes > send_buffer_bytes() && l.out.control->direct_ok.load() != 0 && config_.direct) {
      if (ring.free_bytes() < sizeof(MessageHeader)) return false;
      out.header.mode = MessageMode::kDirect;
      out.header.source = reinterpret_cast<uint64_t>(out.data);
      out.direct_ack = ++l.direct_sent;
      if (l.pid == address_.pid) shm::tsan_release(out.data);  // the receiver reads it directly
      ring.copy_in(ring.own, reinterpret_cast<const uint8_t*>(&out.header), sizeof(MessageHeader));
      out.header_sent = true;
      ring.publish_head(ring.own + sizeof(MessageHeader));
      shm::ring_doorbell_if_sleeping(l.segment.header());
      return true;
    }
  }
  if (out.direct()) return false;  // waiting for the receiver's copy
  while (!send_done(out)) {
    uint64_t free = ring.free_bytes();
    uint64_t at = ring.own;
    if (!out.header_sent) {
      if (free < sizeof(MessageHeader)) break;
      ring.copy_in(at, reinterpret_cast<const uint8_t*>(&out.header), sizeof(MessageHeader));
      at += sizeof(MessageHeader);
      free -= sizeof(MessageHeader);
      out.header_sent = true;
    }
    const uint64_t n = std::min<uint64_t>({free, out.header.bytes - out.sent, config_.chunk_bytes});
    if (n > 0) {
      ring.copy_in(at, out.data + out.sent, n);
      at += n;
      out.sent += n;
    }
    if (at == ring.own) break;
    ring.publish_head(at);
    shm::ring_doorbell_if_sleeping(l.segment.header());
    progressed = true;
  }
  return progressed;
}

// Copies up to chunk_bytes of a direct message from the sender's memory. Throws PeerError if the
// sender's memory cannot be read (it exited, or the kernel refuses).
size_t ShmRail::read_direct(Incoming& in) {
  Link& l = links_[in.peer];
  const size_t n = std::min(in.bytes - in.received, config_.chunk_bytes);
  const uint64_t from = in.source + in.received;
  if (l.pid == address_.pid) {
    std::memcpy(in.data + in.received, reinterpret_cast<const void*>(from), n);
    return n;
  }
  iovec local{in.data + in.received, n};
  iovec remote{reinterpret_cast<void*>(from), n};
  const ssize_t got = ::process_vm_readv(l.pid, &local, 1, &remote, 1, 0);
  if (got <= 0)
    fail_pair(in.peer, where("recv from", in.peer) + " (tag " + std::to_string(in.tag) +
                           "): cannot read its buffer: " + std::strerror(got < 0 ? errno : EIO),
              FailKind::kPeer);
  return static_cast<size_t>(got);
}

bool ShmRail::step_recv(Incoming& in) {
  Link& l = links_[in.peer];
  shm::RingEnd& ring = l.in;
  bool progressed = false;
  if (!in.header_seen) {
    if (ring.readable_bytes() < sizeof(MessageHeader)) return false;
    MessageHeader h;
    ring.copy_out(ring.own, reinterpret_cast<uint8_t*>(&h), sizeof h);
    if (h.tag != in.tag || h.bytes != in.bytes)
      fail_pair(in.peer,
                where("recv from", in.peer) + ": expected tag " + std::to_string(in.tag) + " with " +
                    std::to_string(in.bytes) + " bytes, got tag " + std::to_string(h.tag) + " with " +
                    std::to_string(h.bytes) + " bytes",
                FailKind::kProtocol);
    in.header_seen = true;
    in.direct = h.mode == MessageMode::kDirect;
    in.source = h.source;
    ring.publish_tail(ring.own + sizeof h);
    progressed = true;
    if (in.direct && in.bytes == 0) in.direct = false;  // never sent that way; nothing to read
    if (in.direct && l.pid == address_.pid) shm::tsan_acquire(reinterpret_cast<const void*>(in.source));
  }
  if (in.direct) {
    if (in.done()) return progressed;
    in.received += read_direct(in);
    if (in.done()) {
      // The sender's buffer was valid for the whole copy only if it was still waiting for us: an
      // abort or a failed pair on its side is published before its call returns.
      if (l.segment.header()->closed.load() || l.in.control->broken.load())
        fail_pair(in.peer, where("recv from", in.peer) + ": the sender gave up during a direct read",
                  FailKind::kPeer);
      if (l.pid == address_.pid) shm::tsan_release(reinterpret_cast<const void*>(in.source));
      l.in.control->direct_done.fetch_add(1, std::memory_order_seq_cst);
      shm::ring_doorbell_if_sleeping(l.segment.header());
    }
    return true;
  }
  while (!in.done()) {
    uint64_t readable = ring.readable_bytes();
    const uint64_t n = std::min<uint64_t>({readable, in.bytes - in.received, config_.chunk_bytes});
    if (n == 0) break;
    ring.copy_out(ring.own, in.data + in.received, n);
    in.received += n;
    ring.publish_tail(ring.own + n);
    shm::ring_doorbell_if_sleeping(l.segment.header());
    progressed = true;
  }
  return progressed;
}

void ShmRail::check_blocked_peer(int peer, bool sending, uint64_t tag, bool check_process,
                                 const std::function<bool()>& can_progress) {
  Link& l = links_[peer];
  const std::string what = where(sending ? "send to" : "recv from", peer) + " (tag " + std::to_string(tag) + ")";
  // The peer publishes its last bytes before it closes or exits: once one of the signs below is
  // seen, a fresh look at the ring tells whether there is still something to do.
  if ((l.out.control->broken.load() || l.in.control->broken.load()) && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " closed this pair after an error", FailKind::kPeer);
  if (l.segment.header()->closed.load() && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " closed or aborted its shm rail", FailKind::kPeer);
  if (check_process && shm::process_exited(l.pidfd, l.pid, start_times_[peer]) && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " (pid " + std::to_string(l.pid) + ") exited",
              FailKind::kPeer);
}

void ShmRail::transfer(Outgoing* out, Incoming* in, const Deadline& deadline) {
  using std::chrono::microseconds;
  const auto spin = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(config_.spin_us));
  const long slice_us = static_cast<long>(config_.liveness_slice_ms * 1000);
  shm::SegmentHeader* me = own_.header();
  const auto send_ready = [&] { return send_can_progress(*out); };
  const auto recv_ready = [&] { return recv_can_progress(*in); };
  auto spin_until = Clock::now() + spin;
  for (;;) {
    bool progressed = false;
    if (out && !send_done(*out)) progressed |= step_send(*out);
    if (in && !in->done()) progressed |= step_recv(*in);
    const bool send_pending = out && !send_done(*out), recv_pending = in && !in->done();
    if (!send_pending && !recv_pending) {
      if (out && out->direct() && links_[out->peer].pid == address_.pid) shm::tsan_acquire(out->data);
      return;
    }
    throw_if_aborted();
    const auto now = Clock::now();
    if (progressed) {
      spin_until = now + spin;
      continue;
    }
    if (now < spin_until) {
      shm::cpu_relax();
      continue;
    }
    if (send_pending) check_blocked_peer(out->peer, true, out->header.tag, false, send_ready);
    if (recv_pending) check_blocked_peer(in->peer, false, in->tag, false, recv_ready);
    if (deadline.expired()) {
      const int peer = recv_pending ? in->peer : out->peer;
      const std::string what =
          recv_pending ? where("recv from", peer) + ": timed out waiting for tag " + std::to_string(in->tag) +
                             " (" + std::to_string(in->received) + " of " + std::to_string(in->bytes) + " bytes received)"
                       : where("send to", peer) + ": timed out: the peer stopped reading (tag " +
                             std::to_string(out->header.tag) + ", " + std::to_string(out->sent) + " of " +
                             std::to_string(out->header.bytes) + " bytes sent)";
      fail_pair(peer, what, FailKind::kTimeout);
    }
    me->sleeping.store(1, std::memory_order_seq_cst);
    const uint32_t bell = me->doorbell.load(std::memory_order_seq_cst);
    const bool ready = (send_pending && send_ready()) || (recv_pending && recv_ready()) || aborted_.load();
    if (!ready) {
      const long left_us = std::chrono::duration_cast<microseconds>(deadline.at() - Clock::now()).count();
      shm::futex_wait(&me->doorbell, bell, std::max(1L, std::min(slice_us, left_us)));
    }
    me->sleeping.store(0, std::memory_order_seq_cst);
    if (!ready) {
      if (send_pending) check_blocked_peer(out->peer, true, out->header.tag, true, send_ready);
      if (recv_pending) check_blocked_peer(in->peer, false, in->tag, true, recv_ready);
    }
    spin_until = Clock::now() + spin;
  }
}

void ShmRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  usable_link(peer, "send to");
  ensure_linked(peer, "send to", deadline);
  Outgoing out{peer, {tag, bytes, 0, MessageMode::kInline}, static_cast<const uint8_t*>(data)};
  transfer(&out, nullptr, deadline);
  bytes_sent_ += bytes;
}

void ShmRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  usable_link(peer, "recv from");
  ensure_linked(peer, "recv from", deadline);
  Incoming in{peer, tag, static_cast<uint8_t*>(data), bytes};
  transfer(nullptr, &in, deadline);
  bytes_received_ += bytes;
}

void ShmRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                            int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                            const Deadline& deadline) {
  usable_link(send_peer, "send to");
  usable_link(recv_peer, "recv from");
  ensure_linked(send_peer, "send to", deadline);
  ensure_linked(recv_peer, "recv from", deadline);
  Outgoing out{send_peer, {send_tag, send_bytes, 0, MessageMode::kInline}, static_cast<const uint8_t*>(send_data)};
  Incoming in{recv_peer, recv_tag, static_cast<uint8_t*>(recv_data), recv_bytes};
  transfer(&out, &in, deadline);
  bytes_sent_ += send_bytes;
  bytes_received_ += recv_bytes;
}

}  // namespace nezha::transport
