#include "transport/shm/shm_rail.h"

#include <openssl/sha.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "common/error.h"
#include "common/logging.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace nezha::transport {

using shm::MessageHeader;

namespace {

std::string sha256(const std::string& data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(out.data(), static_cast<std::streamsize>(n)))
    throw NezhaError("shm rail: cannot read /dev/urandom for a nonce");
  return out;
}

std::string from_hex16(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

bool process_exited(int pidfd, int32_t pid, uint64_t start_time) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  if (pid == ::getpid()) return false;
  return shm::process_start_time(pid) != start_time;  // gone, or the pid was reused
}

}  // namespace

struct ShmRail::Outgoing {
  int peer;
  MessageHeader header;
  const uint8_t* data;
  bool header_sent = false;
  size_t sent = 0;
  bool done() const { return header_sent && sent == header.bytes; }
  uint64_t room_needed() const { return header_sent ? 1 : sizeof(MessageHeader); }
};

struct ShmRail::Incoming {
  int peer;
  uint64_t tag;
  uint8_t* data;
  size_t bytes;
  bool header_seen = false;
  size_t received = 0;
  bool done() const { return header_seen && received == bytes; }
  uint64_t bytes_needed() const { return header_seen ? 1 : sizeof(MessageHeader); }
};

ShmRail::ShmRail(ShmRailConfig config, int rank, int size)
    : config_(std::move(config)), rank_(rank), size_(size) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("ShmRail: rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  if (config_.ring_bytes < 4096 || config_.chunk_bytes == 0)
    throw InvalidArgument("rail " + config_.name + ": ring_bytes must be >= 4096 and chunk_bytes > 0");
  properties_.name = config_.name;
  properties_.local_addr = "shm:" + (config_.host_id.empty() ? hostname() : config_.host_id);
  properties_.kind = "shm";
  properties_.reach = RailReach::kHost;
  // Priors until the cost model has measured: a futex wake-up and two copies through memory.
  properties_.latency_us_prior = 5;
  properties_.gbps_prior = 40;
  properties_.max_share_bytes = config_.max_share_bytes;
  job_tag_ = sha256("nezha-shm-job\n" + config_.secret).substr(0, 16);
  nonce_ = random_bytes(16);
  address_ = shm::local_identity(config_.host_id);
  address_.nonce_hex = shm::to_hex(nonce_);
  // Unguessable without the secret and tied to this instance; abstract, so it vanishes with us.
  address_.socket_name = "nezha-shm-" + shm::to_hex(sha256(config_.secret + "\n" + nonce_).substr(0, 16));
  listener_ = shm::HandoffListener(address_.socket_name);
}

ShmRail::~ShmRail() { close(); }

std::string ShmRail::local_address() const { return shm::encode_address(address_); }

std::string ShmRail::where(const char* verb, int peer) const {
  return "rail " + config_.name + ", rank " + std::to_string(rank_) + ": " + verb + " rank " +
         std::to_string(peer);
}

void ShmRail::throw_if_aborted() const {
  if (!aborted_.load()) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw NezhaError("rail " + config_.name + " aborted: " + abort_reason_);
}

void ShmRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument("rail " + config_.name + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_aborted();
  drop_links();
  std::vector<shm::ShmAddress> addrs(static_cast<size_t>(size_));
  std::vector<int> local_ranks;
  std::vector<Link> links(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      addrs[r] = address_;
      local_ranks.push_back(r);
      continue;
    }
    addrs[r] = shm::decode_address(addresses_by_rank[r], where("connect to", r));
    links[r].unreachable_why = shm::same_host_mismatch(address_, addrs[r]);
    links[r].local = links[r].unreachable_why.empty();
    if (links[r].local) local_ranks.push_back(r);
  }
  const auto slot_of = [&](int r) {
    return static_cast<uint32_t>(std::find(local_ranks.begin(), local_ranks.end(), r) - local_ranks.begin());
  };
  shm::SegmentIdentity id{job_tag_, nonce_, address_.pid, address_.start_time, rank_,
                          static_cast<uint32_t>(local_ranks.size()), config_.ring_bytes};
  shm::Segment own = shm::Segment::create(id);
  std::vector<shm::HandoffPeer> peers;
  for (int r : local_ranks)
    if (r != rank_) peers.push_back({r, addrs[r], from_hex16(addrs[r].nonce_hex)});
  std::vector<int> fds = shm::exchange_segment_fds(listener_, rank_, nonce_, own.fd(), peers, aborted_,
                                                   deadline, config_.name);
  own.release_fd();
  // Attach every peer's segment; each fd is owned by its Segment from here on, even on error.
  std::vector<shm::Segment> attached(peers.size());
  std::string failure;
  for (size_t i = 0; i < peers.size(); ++i) {
    const int r = peers[i].rank;
    shm::SegmentIdentity expect{job_tag_, peers[i].nonce, addrs[r].pid, addrs[r].start_time, r, id.slots,
                                config_.ring_bytes};
    try {
      attached[i] = shm::Segment::attach(fds[i], expect, where("connect to", r));
    } catch (const NezhaError& e) {
      if (failure.empty()) failure = e.what();
      for (size_t j = i + 1; j < peers.size(); ++j) ::close(fds[j]);
      throw ProtocolError(failure);
    }
  }
  const uint32_t my_slot = slot_of(rank_);
  for (size_t i = 0; i < peers.size(); ++i) {
    const int r = peers[i].rank;
    Link& l = links[r];
    l.segment = std::move(attached[i]);
    l.out = {l.segment.ring(my_slot), l.segment.ring_data(my_slot), config_.ring_bytes, 0};
    l.in = {own.ring(slot_of(r)), own.ring_data(slot_of(r)), config_.ring_bytes, 0};
    l.pid = addrs[r].pid;
    if (l.pid != address_.pid) {
      l.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, l.pid, 0));
      // The pid may have been reused since the address was made: the start time must still match.
      if (shm::process_start_time(l.pid) != addrs[r].start_time)
        throw PeerError(r, where("connect to", r) + ": its process (pid " + std::to_string(l.pid) + ") is gone");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  own_ = std::move(own);
  links_ = std::move(links);
  start_times_.clear();
  for (int r = 0; r < size_; ++r) start_times_.push_back(addrs[r].start_time);
  connected_ = true;
}

bool ShmRail::reaches(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return connected_ && peer >= 0 && peer < size_ && peer != rank_ && links_[peer].local &&
         links_[peer].closed_reason.empty();
}

void ShmRail::drop_links() {
  std::lock_guard<std::mutex> lock(mu_);
  if (own_.valid()) {
    own_.header()->closed.store(1);
    ring_doorbell(own_.header());
  }
  for (Link& l : links_) {
    if (l.segment.valid()) ring_doorbell(l.segment.header());  // peers waiting on us see closed
    if (l.pidfd >= 0) ::close(l.pidfd);
    l.pidfd = -1;
  }
  links_.clear();
  own_.unmap();
  connected_ = false;
}

void ShmRail::reset() {
  drop_links();
  std::lock_guard<std::mutex> lock(mu_);
  aborted_.store(false);
  abort_reason_.clear();
}

void ShmRail::close() {
  drop_links();
  listener_.close();
}

size_t ShmRail::send_buffer_bytes() const { return config_.ring_bytes - sizeof(MessageHeader); }

RailCounters ShmRail::counters() const { return {bytes_sent_.load(), bytes_received_.load()}; }

void ShmRail::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_reason_.empty()) abort_reason_ = reason;
  aborted_.store(true);
  if (own_.valid()) {
    own_.header()->closed.store(1);
    ring_doorbell(own_.header());  // our own waiter
  }
  for (Link& l : links_)
    if (l.segment.valid()) ring_doorbell(l.segment.header());  // peers blocked on us
}

ShmRail::Link& ShmRail::usable_link(int peer, const char* verb) {
  if (peer < 0 || peer >= size_ || peer == rank_) throw InvalidArgument(where(verb, peer) + ": no such peer");
  throw_if_aborted();
  if (!connected_) throw NezhaError(where(verb, peer) + ": the shm rail is not connected");
  Link& l = links_[peer];
  if (!l.local)
    throw InvalidArgument(where(verb, peer) + ": rank " + std::to_string(peer) +
                          " is not on this host (" + l.unreachable_why +
                          "); a shm rail reaches only the ranks of its own host");
  if (!l.closed_reason.empty())
    throw PeerError(peer, where(verb, peer) + ": no connection: " + l.closed_reason);
  return l;
}

void ShmRail::fail_pair(int peer, const std::string& what, FailKind kind) {
  Link& l = links_[peer];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (l.closed_reason.empty()) l.closed_reason = what;
  }
  l.out.control->broken.store(1);
  l.in.control->broken.store(1);
  ring_doorbell(l.segment.header());
  if (kind == FailKind::kProtocol) throw ProtocolError(what);
  if (kind == FailKind::kTimeout) throw TimeoutError(peer, what);
  throw PeerError(peer, what);
}

bool ShmRail::step_send(Outgoing& out) {
  Link& l = links_[out.peer];
  shm::RingEnd& ring = l.out;
  bool progressed = false;
  while (!out.done()) {
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

bool ShmRail::step_recv(Incoming& in) {
  Link& l = links_[in.peer];
  shm::RingEnd& ring = l.in;
  bool progressed = false;
  while (!in.done()) {
    uint64_t readable = ring.readable_bytes();
    uint64_t at = ring.own;
    if (!in.header_seen) {
      if (readable < sizeof(MessageHeader)) break;
      MessageHeader h;
      ring.copy_out(at, reinterpret_cast<uint8_t*>(&h), sizeof h);
      if (h.tag != in.tag || h.bytes != in.bytes)
        fail_pair(in.peer,
                  where("recv from", in.peer) + ": expected tag " + std::to_string(in.tag) + " with " +
                      std::to_string(in.bytes) + " bytes, got tag " + std::to_string(h.tag) + " with " +
                      std::to_string(h.bytes) + " bytes",
                  FailKind::kProtocol);
      at += sizeof h;
      readable -= sizeof h;
      in.header_seen = true;
    }
    const uint64_t n = std::min<uint64_t>({readable, in.bytes - in.received, config_.chunk_bytes});
    if (n > 0) {
      ring.copy_out(at, in.data + in.received, n);
      at += n;
      in.received += n;
    }
    if (at == ring.own) break;
    ring.publish_tail(at);
    shm::ring_doorbell_if_sleeping(l.segment.header());
    progressed = true;
  }
  return progressed;
}

void ShmRail::check_blocked_peer(int peer, bool sending, uint64_t needed, uint64_t tag, bool check_process) {
  Link& l = links_[peer];
  const char* verb = sending ? "send to" : "recv from";
  // The peer publishes its last bytes before it closes or exits: once one of the signs below is
  // seen, a fresh look at the ring tells whether there is still something to do.
  const auto can_progress = [&] {
    return sending ? l.out.free_bytes() >= needed : l.in.readable_bytes() >= needed;
  };
  const std::string what = where(verb, peer) + " (tag " + std::to_string(tag) + ")";
  if ((l.out.control->broken.load() || l.in.control->broken.load()) && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " closed this pair after an error", FailKind::kPeer);
  if (l.segment.header()->closed.load() && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " closed or aborted its shm rail", FailKind::kPeer);
  if (check_process && process_exited(l.pidfd, l.pid, start_times_[peer]) && !can_progress())
    fail_pair(peer, what + ": rank " + std::to_string(peer) + " (pid " + std::to_string(l.pid) + ") exited",
              FailKind::kPeer);
}

void ShmRail::transfer(Outgoing* out, Incoming* in, const Deadline& deadline) {
  using std::chrono::microseconds;
  const auto spin = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(config_.spin_us));
  const long slice_us = static_cast<long>(config_.liveness_slice_ms * 1000);
  shm::SegmentHeader* me = own_.header();
  auto spin_until = Clock::now() + spin;
  for (;;) {
    bool progressed = false;
    if (out && !out->done()) progressed |= step_send(*out);
    if (in && !in->done()) progressed |= step_recv(*in);
    const bool send_pending = out && !out->done(), recv_pending = in && !in->done();
    if (!send_pending && !recv_pending) return;
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
    if (send_pending) check_blocked_peer(out->peer, true, out->room_needed(), out->header.tag, false);
    if (recv_pending) check_blocked_peer(in->peer, false, in->bytes_needed(), in->tag, false);
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
    const bool ready = (send_pending && links_[out->peer].out.free_bytes() >= out->room_needed()) ||
                       (recv_pending && links_[in->peer].in.readable_bytes() >= in->bytes_needed()) ||
                       aborted_.load();
    if (!ready) {
      const long left_us = std::chrono::duration_cast<microseconds>(deadline.at() - Clock::now()).count();
      shm::futex_wait(&me->doorbell, bell, std::max(1L, std::min(slice_us, left_us)));
    }
    me->sleeping.store(0, std::memory_order_seq_cst);
    if (!ready) {
      if (send_pending) check_blocked_peer(out->peer, true, out->room_needed(), out->header.tag, true);
      if (recv_pending) check_blocked_peer(in->peer, false, in->bytes_needed(), in->tag, true);
    }
    spin_until = Clock::now() + spin;
  }
}

void ShmRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  usable_link(peer, "send to");
  Outgoing out{peer, {tag, bytes}, static_cast<const uint8_t*>(data)};
  transfer(&out, nullptr, deadline);
  bytes_sent_ += bytes;
}

void ShmRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  usable_link(peer, "recv from");
  Incoming in{peer, tag, static_cast<uint8_t*>(data), bytes};
  transfer(nullptr, &in, deadline);
  bytes_received_ += bytes;
}

void ShmRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                            int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                            const Deadline& deadline) {
  usable_link(send_peer, "send to");
  usable_link(recv_peer, "recv from");
  Outgoing out{send_peer, {send_tag, send_bytes}, static_cast<const uint8_t*>(send_data)};
  Incoming in{recv_peer, recv_tag, static_cast<uint8_t*>(recv_data), recv_bytes};
  transfer(&out, &in, deadline);
  bytes_sent_ += send_bytes;
  bytes_received_ += recv_bytes;
}

std::unique_ptr<Rail> make_shm_rail(const RailSpec& spec, const RailContext& ctx) {
  reject_unknown_options(spec, {"ring_bytes", "chunk_bytes", "spin_us", "max_share_bytes"});
  ShmRailConfig c;
  c.name = spec.name.empty() ? "shm" : spec.name;
  c.secret = ctx.secret;
  c.host_id = ctx.host_id;
  c.ring_bytes = rail_option_bytes(spec, "ring_bytes", c.ring_bytes);
  c.chunk_bytes = rail_option_bytes(spec, "chunk_bytes", c.chunk_bytes);
  c.spin_us = static_cast<double>(rail_option_bytes(spec, "spin_us", static_cast<size_t>(c.spin_us)));
  c.max_share_bytes = rail_option_bytes(spec, "max_share_bytes", 0);
  return std::make_unique<ShmRail>(c, ctx.rank, ctx.size);
}

}  // namespace nezha::transport
