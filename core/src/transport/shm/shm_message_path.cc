#include "transport/shm/shm_message_path.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace nezha::transport {

namespace {

constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;  // far above what the engine sends
constexpr uint64_t kPublishBytes = 64 << 10;              // the receiver may start before the rest is in

void write_eventfd(int fd) {
  const uint64_t one = 1;
  // EAGAIN only at a counter near 2^64: the doorbell is rung already.
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
}

}  // namespace

ShmMessagePath::ShmMessagePath(ShmMessagePathConfig config, int rank, int size)
    : config_(std::move(config)), rank_(rank), size_(size), links_(static_cast<size_t>(std::max(size, 0))) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument(config_.name + ": rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  shm::LocalEndpoint e = shm::make_local_endpoint("control", config_.secret, config_.host_id);
  job_tag_ = std::move(e.job_tag);
  nonce_ = std::move(e.nonce);
  address_ = std::move(e.address);
  listener_ = shm::HandoffListener(address_.socket_name);
  doorbell_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (doorbell_ < 0) throw NezhaError(config_.name + ": eventfd failed: " + std::strerror(errno));
}

ShmMessagePath::~ShmMessagePath() {
  close();
  if (doorbell_ >= 0) ::close(doorbell_);
}

std::string ShmMessagePath::local_address() const { return shm::encode_address(address_); }

std::string ShmMessagePath::where(const char* verb, int peer) const {
  return config_.name + ", rank " + std::to_string(rank_) + ": " + verb + " rank " + std::to_string(peer);
}

void ShmMessagePath::throw_if_aborted() const {
  if (!aborted_.load()) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw NezhaError(config_.name + " aborted: " + abort_reason_);
}

void ShmMessagePath::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument(config_.name + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_aborted();
  drop_links();
  std::vector<shm::HandoffPeer> peers;
  std::vector<shm::ShmAddress> addrs(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || addresses_by_rank[r].empty()) continue;
    addrs[r] = shm::decode_address(addresses_by_rank[r], where("connect to", r));
    if (!shm::same_host_mismatch(address_, addrs[r]).empty()) continue;  // another path's peer
    peers.push_back({r, addrs[r], shm::from_hex(addrs[r].nonce_hex, where("connect to", r))});
  }
  // Rings shrink as the job grows so a segment stays within its budget; every rank computes the same
  // size, so each knows the layout of every peer's segment. Only the rings of linked peers are ever
  // touched: the rest costs address space, not memory.
  const size_t fitting = config_.segment_budget / static_cast<size_t>(std::max(1, size_ - 1)) / 4096 * 4096;
  ring_bytes_ = std::min(config_.max_ring_bytes, std::max(kMinRingBytes, fitting));
  auto trailer_of = [&](int owner) -> uint64_t { return owner == 0 ? config_.host_board_bytes : 0; };
  shm::SegmentIdentity id{job_tag_, nonce_, address_.pid, address_.start_time, rank_,
                          static_cast<uint32_t>(size_), ring_bytes_, trailer_of(rank_)};
  shm::Segment own = shm::Segment::create(id);
  std::vector<std::vector<int>> fds;
  if (!peers.empty())
    fds = shm::exchange_fds(listener_, rank_, nonce_, {own.fd(), doorbell_}, peers, aborted_, deadline,
                            config_.name);
  own.release_fd();
  std::vector<Link> links(static_cast<size_t>(size_));
  auto close_rest = [&](size_t from) {
    for (size_t j = from; j < fds.size(); ++j)
      for (int fd : fds[j]) ::close(fd);
  };
  auto close_links = [&] {
    for (Link& l : links) {
      if (l.doorbell >= 0) ::close(l.doorbell);
      if (l.pidfd >= 0) ::close(l.pidfd);
    }
  };
  for (size_t i = 0; i < peers.size(); ++i) {
    const int r = peers[i].rank;
    Link& l = links[r];
    l.doorbell = fds[i][1];
    try {
      const int seg_fd = fds[i][0];
      fds[i].clear();
      l.segment = shm::Segment::attach(seg_fd, {job_tag_, peers[i].nonce, addrs[r].pid, addrs[r].start_time, r,
                                                static_cast<uint32_t>(size_), ring_bytes_, trailer_of(r)},
                                       where("connect to", r));
    } catch (...) {
      close_rest(i + 1);
      close_links();
      throw;
    }
    l.linked = true;
    l.out = {l.segment.ring(static_cast<uint32_t>(rank_)), l.segment.ring_data(static_cast<uint32_t>(rank_)),
             ring_bytes_, 0};
    l.in = {own.ring(static_cast<uint32_t>(r)), own.ring_data(static_cast<uint32_t>(r)), ring_bytes_, 0};
    l.pid = addrs[r].pid;
    l.start_time = addrs[r].start_time;
    if (l.pid != address_.pid) {
      l.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, l.pid, 0));
      // The pid may have been reused since the address was made: the start time must still match.
      if (shm::process_start_time(l.pid) != l.start_time) {
        close_rest(i + 1);
        close_links();
        throw PeerError(r, where("connect to", r) + ": its process (pid " + std::to_string(l.pid) + ") is gone");
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  own_ = std::move(own);
  links_ = std::move(links);
  linked_peers_.clear();
  for (int r = 0; r < size_; ++r)
    if (links_[static_cast<size_t>(r)].linked) linked_peers_.push_back(r);
}

MessagePath::HostBoard ShmMessagePath::host_board() const {
  if (config_.host_board_bytes == 0) return {};
  const shm::Segment* seg = rank_ == 0 ? &own_ : (links_.empty() || !links_[0].linked ? nullptr : &links_[0].segment);
  if (seg == nullptr || !seg->valid()) return {};
  return {seg->trailer(), static_cast<size_t>(seg->trailer_bytes())};
}

bool ShmMessagePath::reaches(int peer) const {
  return peer >= 0 && peer < size_ && links_[static_cast<size_t>(peer)].linked &&
         links_[static_cast<size_t>(peer)].failed.empty();
}

void ShmMessagePath::drop_links() {
  std::lock_guard<std::mutex> lock(mu_);
  if (own_.valid()) own_.header()->closed.store(1);
  for (Link& l : links_) {
    if (l.doorbell >= 0) {
      write_eventfd(l.doorbell);  // a peer waiting on us sees the segment closed
      ::close(l.doorbell);
    }
    if (l.pidfd >= 0) ::close(l.pidfd);
    l = Link{};
  }
  linked_peers_.clear();
  own_.unmap();
  pending_.clear();
}

void ShmMessagePath::close() {
  drop_links();
  listener_.close();
}

void ShmMessagePath::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_reason_.empty()) abort_reason_ = reason;
  aborted_.store(true);
  if (own_.valid()) own_.header()->closed.store(1);
  write_eventfd(doorbell_);  // our own waiter
  for (const Link& l : links_)
    if (l.doorbell >= 0) write_eventfd(l.doorbell);
}

void ShmMessagePath::ring(const Link& l) const {
  if (l.segment.header()->sleeping.load(std::memory_order_seq_cst) != 0) write_eventfd(l.doorbell);
}

void ShmMessagePath::ring_for_message(const Link& l) const {
  shm::SegmentHeader* h = l.segment.header();
  // A count left over from an earlier wait (the owner reset it meanwhile) only rings early.
  if (h->sleeping.load(std::memory_order_seq_cst) != 0 && h->wake_after.fetch_sub(1, std::memory_order_seq_cst) <= 1)
    write_eventfd(l.doorbell);
}

void ShmMessagePath::wake_after_messages(int messages) {
  wake_after_ = std::max(1, messages);
  if (wake_after_ > 1 || !armed_with_count_ || !own_.valid()) return;
  armed_with_count_ = false;
  // Armed with a count and maybe still armed (the waiter that set it left without reading, e.g.
  // a lead that ended): senders that counted down without ringing left their messages
  // unannounced, and whoever waits next without re-arming (the loop thread, asleep since before
  // the lead) must be woken for them. The count first, then the rings: a sender either rings
  // itself or published before this look.
  own_.header()->wake_after.store(1, std::memory_order_seq_cst);
  if (rings_hold_data()) write_eventfd(doorbell_);
}

void ShmMessagePath::drain_doorbell() const {
  // One read takes an eventfd's whole count (no EFD_SEMAPHORE); a write after it makes it readable
  // again, which is what the next wait must see.
  uint64_t v;
  (void)::read(doorbell_, &v, sizeof v);
}

bool ShmMessagePath::rings_hold_data() const {
  if (!pending_.empty()) return true;
  for (int peer : linked_peers_) {
    const Link& l = links_[static_cast<size_t>(peer)];
    if (l.failed.empty() && (l.in.readable_bytes() > 0 || l.segment.header()->closed.load() != 0)) return true;
  }
  return false;
}

bool ShmMessagePath::readable_now() const { return own_.valid() && rings_hold_data(); }

void ShmMessagePath::arm() const {
  if (!own_.valid()) return;
  // The count before the flag: a sender that sees the flag counts down this wait's count. Messages
  // already in (the re-check below) ring at once, whatever the count.
  own_.header()->wake_after.store(wake_after_, std::memory_order_seq_cst);
  armed_with_count_ = armed_with_count_ || wake_after_ > 1;
  own_.header()->sleeping.store(1, std::memory_order_seq_cst);
  // A publisher that looked at the flag before it was set did not ring: look at the rings again.
  if (rings_hold_data()) write_eventfd(doorbell_);
}

void ShmMessagePath::append_poll_fds(std::vector<pollfd>& fds) const {
  arm();
  fds.push_back({doorbell_, POLLIN, 0});
  for (int peer : linked_peers_) {
    const Link& l = links_[static_cast<size_t>(peer)];
    if (l.failed.empty() && l.pidfd >= 0) fds.push_back({l.pidfd, POLLIN, 0});
  }
}

void ShmMessagePath::read_ring(int peer, Link& l, std::vector<Message>& out) {
  bool consumed = false;
  for (;;) {
    uint64_t readable = l.in.readable_bytes();
    if (readable == 0) break;
    if (l.length_have < sizeof l.length) {
      const uint64_t n = std::min<uint64_t>(readable, sizeof l.length - l.length_have);
      l.in.copy_out(l.in.own, l.length + l.length_have, n);
      l.in.publish_tail(l.in.own + n);
      l.length_have += n;
      consumed = true;
      if (l.length_have < sizeof l.length) break;
      std::memcpy(&l.need, l.length, sizeof l.need);
      if (l.need > kMaxMessageBytes)
        throw ProtocolError(where("recv from", peer) + ": a message of " + std::to_string(l.need) + " bytes");
      l.partial.clear();
      l.partial.reserve(l.need);
      readable -= n;
    }
    const uint64_t n = std::min<uint64_t>(readable, l.need - l.partial.size());
    if (n > 0) {
      const size_t at = l.partial.size();
      l.partial.resize(at + n);
      l.in.copy_out(l.in.own, reinterpret_cast<uint8_t*>(l.partial.data() + at), n);
      l.in.publish_tail(l.in.own + n);
      consumed = true;
    }
    if (l.partial.size() < l.need) break;
    out.push_back({peer, std::move(l.partial)});
    l.partial = std::string();
    l.length_have = 0;
    l.need = 0;
  }
  // Only a producer blocked on this ring waits for the space: waking one that sleeps for another
  // reason costs it a wake-up (and, on a busy host, the core) for nothing.
  if (consumed && l.in.control->producer_waiting.load(std::memory_order_seq_cst) != 0) write_eventfd(l.doorbell);
}

void ShmMessagePath::read_rings(std::vector<Message>& out) {
  for (int peer : linked_peers_) {
    Link& l = links_[static_cast<size_t>(peer)];
    if (l.failed.empty()) read_ring(peer, l, out);
  }
}

void ShmMessagePath::fail_link(int peer, const std::string& why) {
  Link& l = links_[static_cast<size_t>(peer)];
  l.failed = why;
  throw PeerError(peer, why);
}

void ShmMessagePath::check_gone(const std::vector<char>& exited, std::vector<Message>& out) {
  for (int peer : linked_peers_) {
    Link& l = links_[static_cast<size_t>(peer)];
    if (!l.failed.empty()) continue;
    const bool closed = l.segment.header()->closed.load() != 0;
    if (!closed && !exited[static_cast<size_t>(peer)]) continue;
    read_ring(peer, l, out);  // its last words come first
    if (closed) fail_link(peer, where("recv from", peer) + ": rank " + std::to_string(peer) + " closed its control path");
    fail_link(peer, where("recv from", peer) + ": rank " + std::to_string(peer) + " (pid " + std::to_string(l.pid) +
                        ") exited");
  }
}

void ShmMessagePath::read_polled(const pollfd* fds, size_t n, std::vector<Message>& out) {
  auto hand_over = [&] {
    for (Message& m : pending_) out.push_back(std::move(m));
    pending_.clear();
  };
  try {
    throw_if_aborted();
    if (!own_.valid()) return;
    own_.header()->sleeping.store(0, std::memory_order_seq_cst);
    own_.header()->wake_after.store(1, std::memory_order_seq_cst);
    drain_doorbell();
    std::vector<char> exited(static_cast<size_t>(size_), 0);
    for (size_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0 || fds[i].fd == doorbell_) continue;
      for (int peer : linked_peers_)
        if (links_[static_cast<size_t>(peer)].pidfd == fds[i].fd) exited[static_cast<size_t>(peer)] = 1;
    }
    hand_over();
    read_rings(out);
    check_gone(exited, out);
  } catch (...) {
    hand_over();
    throw;
  }
}

std::optional<MessagePath::Message> ShmMessagePath::recv_message_any(int wake_fd, const Deadline& deadline) {
  std::vector<pollfd> fds;
  std::vector<Message> got;
  for (;;) {
    if (!pending_.empty()) {
      Message m = std::move(pending_.front());
      pending_.pop_front();
      return m;
    }
    fds.clear();
    append_poll_fds(fds);
    const size_t own_fds = fds.size();
    if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), deadline.remaining_ms());
    if (ready < 0 && errno != EINTR) throw NezhaError(config_.name + ": poll() failed: " + std::strerror(errno));
    got.clear();
    read_polled(fds.data(), own_fds, got);
    for (Message& m : got) pending_.push_back(std::move(m));
    if (!pending_.empty()) continue;
    if (wake_fd >= 0 && (fds[own_fds].revents & POLLIN)) return std::nullopt;
    if (deadline.expired()) return std::nullopt;
  }
}

void ShmMessagePath::wait_for_space(int peer, Link& l, const Deadline& deadline) {
  // What peers send meanwhile is taken in: two ranks filling each other's rings would otherwise
  // wait for each other.
  std::vector<Message> got;
  read_rings(got);
  for (Message& m : got) pending_.push_back(std::move(m));
  // Dekker with read_ring(): the flag before the re-check of the space, so either this rank sees
  // the consumer's new tail or the consumer sees the flag and rings.
  l.out.control->producer_waiting.store(1, std::memory_order_seq_cst);
  own_.header()->wake_after.store(1, std::memory_order_seq_cst);  // any message wakes a blocked sender
  own_.header()->sleeping.store(1, std::memory_order_seq_cst);
  if (l.out.free_bytes() == 0 && !aborted_.load()) {
    pollfd fds[2] = {{doorbell_, POLLIN, 0}, {l.pidfd, POLLIN, 0}};
    const long slice_ms = std::max(1L, static_cast<long>(config_.liveness_slice_ms));
    ::poll(fds, l.pidfd >= 0 ? 2 : 1, static_cast<int>(std::min<long>(slice_ms, deadline.remaining_ms())));
  }
  own_.header()->sleeping.store(0, std::memory_order_seq_cst);
  l.out.control->producer_waiting.store(0, std::memory_order_seq_cst);
  drain_doorbell();
  if (!pending_.empty()) write_eventfd(doorbell_);  // the caller's next wait must not sleep on them
  throw_if_aborted();
  if (l.out.free_bytes() > 0) return;
  if (l.segment.header()->closed.load() != 0)
    fail_link(peer, where("send to", peer) + ": rank " + std::to_string(peer) + " closed its control path");
  if (shm::process_exited(l.pidfd, l.pid, l.start_time))
    fail_link(peer, where("send to", peer) + ": rank " + std::to_string(peer) + " (pid " + std::to_string(l.pid) +
                        ") exited");
  if (deadline.expired())
    throw TimeoutError(peer, where("send to", peer) + ": timed out: rank " + std::to_string(peer) +
                                 " stopped reading control messages (its ring is full)");
}

void ShmMessagePath::send_message(int peer, const std::string& payload, const Deadline& deadline) {
  if (peer < 0 || peer >= size_ || peer == rank_) throw InvalidArgument(where("send to", peer) + ": no such peer");
  throw_if_aborted();
  Link& l = links_[static_cast<size_t>(peer)];
  if (!l.linked)
    throw InvalidArgument(where("send to", peer) + ": not linked (not on this host, or left out at connect)");
  if (!l.failed.empty()) throw PeerError(peer, where("send to", peer) + ": " + l.failed);
  const uint64_t length = payload.size();
  const uint8_t* parts[2] = {reinterpret_cast<const uint8_t*>(&length),
                             reinterpret_cast<const uint8_t*>(payload.data())};
  const uint64_t sizes[2] = {sizeof length, length};
  for (int part = 0; part < 2; ++part) {
    uint64_t done = 0;
    while (done < sizes[part]) {
      const uint64_t free = l.out.free_bytes();
      if (free == 0) {
        ring(l);  // it must read before we can go on
        wait_for_space(peer, l, deadline);
        continue;
      }
      const uint64_t n = std::min({free, sizes[part] - done, kPublishBytes});
      l.out.copy_in(l.out.own, parts[part] + done, n);
      l.out.publish_head(l.out.own + n);
      done += n;
    }
  }
  ring_for_message(l);
}

std::unique_ptr<MessagePath> make_shm_message_path(const RailSpec& spec, const RailContext& ctx) {
  reject_unknown_options(spec, {});
  ShmMessagePathConfig c;
  c.name = spec.name.empty() ? "control/shm" : spec.name;
  c.secret = ctx.secret;
  c.host_id = ctx.host_id;
  c.host_board_bytes = ctx.host_board_bytes;
  return std::make_unique<ShmMessagePath>(c, ctx.rank, ctx.size);
}

}  // namespace nezha::transport
