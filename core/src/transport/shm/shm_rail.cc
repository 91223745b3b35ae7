#include "transport/shm/shm_rail.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/error.h"
#include "common/logging.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace nezha::transport {

using shm::MessageHeader;

namespace {

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}


// True if this process may read `pid`'s memory (process_vm_readv: same user and ptrace rules);
// `segment_base` is where pid mapped a segment, whose first word is its magic.
bool can_read_memory_of(int32_t pid, uint64_t segment_base) {
  if (pid == ::getpid()) return true;
  uint64_t word = 0;
  iovec local{&word, sizeof word};
  iovec remote{reinterpret_cast<void*>(segment_base), sizeof word};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof word && word == shm::kSegmentMagic;
}

}  // namespace

ShmRail::ShmRail(ShmRailConfig config, int rank, int size)
    : config_(std::move(config)), ring_bytes_(config_.ring_bytes), rank_(rank), size_(size) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("ShmRail: rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  if (config_.ring_bytes < 4096 || config_.chunk_bytes == 0)
    throw InvalidArgument("rail " + config_.name + ": ring_bytes must be >= 4096 and chunk_bytes > 0");
  properties_.name = config_.name;
  properties_.local_addr = "shm:" + (config_.host_id.empty() ? hostname() : config_.host_id);
  properties_.kind = "shm";
  properties_.reach = RailReach::kHost;
  properties_.host_memory = true;
  properties_.can_fail_alone = false;  // shared memory: fails only with a rank
  // Priors until the cost model has measured: a futex wake-up and two copies through memory.
  properties_.latency_us_prior = 5;
  properties_.gbps_prior = 40;
  properties_.max_share_bytes = config_.max_share_bytes;
  shm::LocalEndpoint e = shm::make_local_endpoint("shm", config_.secret, config_.host_id);
  job_tag_ = std::move(e.job_tag);
  nonce_ = std::move(e.nonce);
  address_ = std::move(e.address);
  listener_ = shm::HandoffListener(address_.socket_name);
  abort_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (abort_fd_ < 0) throw NezhaError("rail " + config_.name + ": eventfd failed: " + std::strerror(errno));
}

ShmRail::~ShmRail() {
  close();
  ::close(abort_fd_);
}

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

std::string ShmRail::host_key(const std::string& address) const {
  return shm::host_key(shm::decode_address(address, "rail " + config_.name + ": host_key"));
}

// Waits for no peer (so the deadline is unused): pairs link on their first data call.
void ShmRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& /*deadline*/) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument("rail " + config_.name + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_aborted();
  drop_links();
  std::vector<shm::ShmAddress> addrs(static_cast<size_t>(size_));
  std::vector<Link> links(static_cast<size_t>(size_));
  std::vector<uint32_t> slot_of(static_cast<size_t>(size_), 0);
  uint32_t slots = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      addrs[r] = address_;
      slot_of[r] = slots++;
      continue;
    }
    addrs[r] = shm::decode_address(addresses_by_rank[r], where("connect to", r));
    links[r].unreachable_why = shm::same_host_mismatch(address_, addrs[r]);
    links[r].local = links[r].unreachable_why.empty();
    if (links[r].local) slot_of[r] = slots++;
  }
  ring_bytes_ = ring_bytes_for(slots);
  shm::Segment own = shm::Segment::create(
      {job_tag_, nonce_, address_.pid, address_.start_time, rank_, slots, ring_bytes_});
  {
    std::lock_guard<std::mutex> lock(mu_);
    own_ = std::move(own);
    links_ = std::move(links);
    addrs_ = std::move(addrs);
    slot_of_ = std::move(slot_of);
    slots_ = slots;
    offered_.clear();
    offered_.resize(static_cast<size_t>(size_));
    start_times_.clear();
    for (int r = 0; r < size_; ++r) start_times_.push_back(addrs_[r].start_time);
    fetched_.store(0);
    connected_ = true;
  }
  serve_own_segment();
}

shm::SegmentIdentity ShmRail::identity_of(int peer) const {
  const shm::ShmAddress& a = addrs_[peer];
  return {job_tag_, shm::from_hex(a.nonce_hex, "rail '" + config_.name + "': rank " + std::to_string(peer) + "'s address"),
          a.pid, a.start_time, peer, slots_, ring_bytes_};
}

void ShmRail::serve_own_segment() {
  std::map<int, shm::PairPeerId> peers;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && links_[r].local) peers[r] = {addrs_[r].pid, identity_of(r).nonce};
  auto server = std::make_unique<shm::SegmentServer>(listener_.fd(), own_.fd(), std::move(peers),
                                                     "rail " + config_.name + ", rank " + std::to_string(rank_),
                                                     [this](int peer, int fd) { offer(peer, fd); });
  std::lock_guard<std::mutex> lock(mu_);
  server_ = std::move(server);
}

void ShmRail::offer(int peer, int fd) {
  // Mapped and checked here, off the data thread; kept until the pair's first data call takes it.
  shm::Segment segment = shm::Segment::attach(fd, identity_of(peer), where("segment handed over by", peer));
  // A request can outlive the connection that sent it (queued on our socket while we were between
  // reset() and connect()); its segment was closed by the peer's reset. Sends into it would be lost:
  // drop it, and the pair's first data call fetches the live one.
  if (segment.header()->closed.load() != 0) {
    NZ_LOG(Debug) << where("dropped a closed segment handed over by", peer);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!links_[peer].linked && !offered_[peer].valid()) offered_[peer] = std::move(segment);
}

void ShmRail::ensure_linked(int peer, const char* verb, const Deadline& deadline) {
  Link& l = links_[peer];
  if (l.linked) return;
  shm::Segment segment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    segment = std::move(offered_[peer]);
  }
  const int32_t pid = addrs_[peer].pid;
  int pidfd = -1;
  if (pid != address_.pid) {
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    // The pid may have been reused since the address was made: the start time must still match.
    if (shm::process_start_time(pid) != addrs_[peer].start_time) {
      if (pidfd >= 0) ::close(pidfd);
      fail_pair(peer, where(verb, peer) + ": its process (pid " + std::to_string(pid) + ") exited", FailKind::kPeer);
    }
  }
  try {
    if (!segment.valid()) {
      shm::PairRequest request{rank_, nonce_, own_.fd(), peer, pid, addrs_[peer].socket_name, where(verb, peer)};
      const int fd = shm::fetch_peer_segment(request, abort_fd_, [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return aborted_.load() ? abort_reason_ : std::string();
      }, pidfd, deadline);
      fetched_.fetch_add(1);
      segment = shm::Segment::attach(fd, identity_of(peer), where(verb, peer));
    }
  } catch (const TimeoutError& e) {
    if (pidfd >= 0) ::close(pidfd);
    fail_pair(peer, e.what(), FailKind::kTimeout);
  } catch (const PeerError& e) {
    if (pidfd >= 0) ::close(pidfd);
    fail_pair(peer, e.what(), FailKind::kPeer);
  } catch (const ProtocolError& e) {
    if (pidfd >= 0) ::close(pidfd);
    fail_pair(peer, e.what(), FailKind::kProtocol);
  } catch (...) {  // an abort, or this rank's own resources: the pair itself is not at fault
    if (pidfd >= 0) ::close(pidfd);
    throw;
  }
  const uint32_t mine = slot_of_[rank_], theirs = slot_of_[peer];
  l.out = {segment.ring(mine), segment.ring_data(mine), ring_bytes_, 0};
  l.in = {own_.ring(theirs), own_.ring_data(theirs), ring_bytes_, 0};
  l.pid = pid;
  // Direct (single-copy) messages from the peer need this rank to read its memory: probe it once.
  l.in.control->direct_ok.store(can_read_memory_of(pid, segment.header()->creator_base) ? 1 : 0);
  shm::Segment spare;  // the peer's own handoff, when both ends asked at once: one mapping is enough
  std::lock_guard<std::mutex> lock(mu_);
  spare = std::move(offered_[peer]);
  l.segment = std::move(segment);
  l.pidfd = pidfd;
  l.linked = true;
}

bool ShmRail::reaches(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return connected_ && peer >= 0 && peer < size_ && peer != rank_ && links_[peer].local &&
         links_[peer].closed_reason.empty();
}

void ShmRail::drop_links() {
  std::unique_ptr<shm::SegmentServer> server;
  {
    std::lock_guard<std::mutex> lock(mu_);
    server = std::move(server_);
  }
  server.reset();  // stopped outside mu_: its deliveries take mu_
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
  for (shm::Segment& s : offered_)
    if (s.valid()) ring_doorbell(s.header());
  links_.clear();
  offered_.clear();
  own_.unmap();
  connected_ = false;
}

void ShmRail::reset() {
  drop_links();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t count = 0;
  while (::read(abort_fd_, &count, sizeof count) > 0) {
  }
  aborted_.store(false);
  abort_reason_.clear();
}

void ShmRail::close() {
  drop_links();
  listener_.close();
}

size_t ShmRail::send_buffer_bytes() const { return ring_bytes_ - sizeof(MessageHeader); }

size_t ShmRail::ring_bytes_for(size_t local_ranks) const {
  const size_t peers = std::max<size_t>(1, local_ranks - 1);
  const size_t fitting = config_.segment_budget / peers / 4096 * 4096;  // whole pages
  return std::min(config_.ring_bytes, std::max(kMinRingBytes, fitting));
}

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
  for (shm::Segment& s : offered_)  // peers that linked us before we linked them
    if (s.valid()) ring_doorbell(s.header());
  const uint64_t one = 1;
  if (::write(abort_fd_, &one, sizeof one) != sizeof one)  // a first link waiting for a segment
    NZ_LOG(Error) << "rail " << config_.name << ": cannot signal the abort eventfd: " << std::strerror(errno);
}

ShmRail::HandoffCounts ShmRail::handoffs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {fetched_.load(), server_ ? server_->served() : 0};
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
  if (l.linked) {
    l.out.control->broken.store(1);
    l.in.control->broken.store(1);
    ring_doorbell(l.segment.header());
  } else {
    own_.ring(slot_of_[peer])->broken.store(1);  // the peer's sends to us stop at once
  }
  if (kind == FailKind::kProtocol) throw ProtocolError(what);
  if (kind == FailKind::kTimeout) throw TimeoutError(peer, what);
  throw PeerError(peer, what);
}

std::unique_ptr<Rail> make_shm_rail(const RailSpec& spec, const RailContext& ctx) {
  reject_unknown_options(spec, {"ring_bytes", "chunk_bytes", "spin_us", "max_share_bytes", "direct"});
  ShmRailConfig c;
  c.name = spec.name.empty() ? "shm" : spec.name;
  c.secret = ctx.secret;
  c.host_id = ctx.host_id;
  c.ring_bytes = rail_option_bytes(spec, "ring_bytes", c.ring_bytes);
  c.chunk_bytes = rail_option_bytes(spec, "chunk_bytes", c.chunk_bytes);
  // Where the ranks outnumber the cores the peer a spinning rank waits for most likely has no core.
  const size_t spin_default = ranks_outnumber_cores(ctx) ? 0 : static_cast<size_t>(c.spin_us);
  c.spin_us = static_cast<double>(rail_option_bytes(spec, "spin_us", spin_default));
  c.max_share_bytes = rail_option_bytes(spec, "max_share_bytes", 0);
  c.direct = rail_option_bytes(spec, "direct", 1) != 0;
  return std::make_unique<ShmRail>(c, ctx.rank, ctx.size);
}

}  // namespace nezha::transport
