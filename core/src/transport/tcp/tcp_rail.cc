#include "transport/tcp/tcp_rail.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"

namespace nezha::transport {

using tcp::Fd;
using tcp::FrameReceiver;
using tcp::FrameSender;
using tcp::SocketFailure;

namespace {

std::string seconds_since(Clock::time_point start) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f",
                std::chrono::duration<double>(Clock::now() - start).count());
  return buf;
}

// Half of the socket's SO_SNDBUF (the kernel doubles what was asked for, for its bookkeeping): what
// a send can hand over without the peer reading; 0 if unknown.
size_t usable_send_buffer(int fd) {
  int bytes = 0;
  socklen_t len = sizeof bytes;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &len) != 0 || bytes <= 0) return 0;
  return static_cast<size_t>(bytes) / 2;
}

// Errors after which retrying the connect makes sense: the peer may not be listening yet.
bool retryable_connect_error(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == EAGAIN;
}

}  // namespace

struct TcpRail::Outgoing {
  int peer;
  uint64_t tag;  // named in errors
  FrameSender sender;
};

struct TcpRail::Incoming {
  int peer;
  uint64_t tag;  // named in errors
  FrameReceiver receiver;
  FrameReceiver::HeaderHandler on_header;
};

TcpRail::TcpRail(TcpRailConfig config, int rank, int size)
    : config_(std::move(config)),
      rank_(rank),
      size_(size),
      peers_(size > 0 ? size : 0),
      reachable_(new std::atomic<bool>[size > 0 ? size : 0]()),
      watched_fds_(new std::atomic<int>[size > 0 ? size : 0]) {
  for (int peer = 0; peer < size; ++peer) watched_fds_[peer].store(-1);
  if (size <= 0 || rank < 0 || rank >= size)
    throw InvalidArgument("TcpRail: rank " + std::to_string(rank) + " is outside a job of " +
                          std::to_string(size) + " ranks");
  properties_.name = config_.name;
  properties_.local_addr = config_.local_addr;
  properties_.bind_ip = config_.local_addr;
  properties_.kind = config_.mptcp ? "mptcp" : "tcp";
  properties_.reach = RailReach::kJob;
  properties_.host_memory = config_.local_addr.rfind("127.", 0) == 0;  // loopback: the kernel copies
  properties_.max_share_bytes = config_.max_share_bytes;
  if (!config_.mptcp && !config_.local_addr.empty())
    link_ = std::make_unique<tcp::LinkState>(config_.local_addr);

  abort_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!abort_fd_.valid()) throw NezhaError("rail " + config_.name + ": eventfd() failed: " + tcp::errno_text(errno));

  Fd listener = tcp::open_stream_socket(config_.mptcp);
  int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  tcp::tune_socket(listener.get(), config_.socket_buffer_bytes);  // inherited by accepted sockets
  // An MPTCP listener must accept the extra subflows a peer opens to this host's *other*
  // addresses (announced by the kernel's path manager), so it is the one listener bound to every
  // address; the HMAC handshake still refuses strangers. Plain TCP rails bind to their address only.
  const sockaddr_in addr = tcp::ipv4_address(config_.mptcp ? "0.0.0.0" : config_.local_addr, 0);
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw NezhaError("rail " + config_.name + ": cannot bind " + config_.local_addr + ": " +
                     tcp::errno_text(errno));
  if (::listen(listener.get(), SOMAXCONN) != 0)
    throw NezhaError("rail " + config_.name + ": listen() on " + config_.local_addr + " failed: " +
                     tcp::errno_text(errno));
  listen_address_ = tcp::local_endpoint(listener.get());
  if (config_.mptcp)
    listen_address_ = config_.local_addr + listen_address_.substr(listen_address_.rfind(':'));

  HandshakeParams params{config_.secret, rank_, size_, config_.rail_index};
  acceptor_ = std::make_unique<tcp::Acceptor>(
      std::move(listener), params, config_.name, config_.handshake_timeout_s,
      config_.socket_buffer_bytes,
      [this](int peer, Fd fd, const std::string& remote) { admit(peer, std::move(fd), remote); });
}

TcpRail::~TcpRail() { close(); }

std::string TcpRail::local_address() const { return listen_address_; }

bool TcpRail::reaches(int peer) const {
  return peer >= 0 && peer < size_ && peer != rank_ && !aborted_.load(std::memory_order_acquire) &&
         reachable_[peer].load(std::memory_order_acquire);
}

std::string TcpRail::rank_name(int peer) const { return "rank " + std::to_string(peer); }

void TcpRail::admit(int peer, Fd fd, const std::string& remote) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!admitting_ || peer < rank_ || peers_[peer].fd.valid() || !peers_[peer].closed_reason.empty()) {
    // Outside connect() (initial or after reset()) the running connection wins; a connection
    // closed by an error stays closed until reset().
    NZ_LOG(Warning) << "rail " << config_.name << ": dropped authenticated connection from rank "
                    << peer << " at " << remote << ": "
                    << (peer < rank_ ? "lower ranks are dialed by this rank, not accepted"
                        : peers_[peer].closed_reason.empty() ? "that rank is already connected"
                                                             : "its connection failed: " + peers_[peer].closed_reason);
    return;
  }
  peers_[peer].fd = std::move(fd);
  watched_fds_[peer].store(peers_[peer].fd.get(), std::memory_order_release);
  reachable_[peer].store(true, std::memory_order_release);
  admitted_.notify_all();
}

void TcpRail::connect_to(int peer, const std::string& endpoint, const Deadline& deadline) {
  const sockaddr_in to = tcp::parse_ipv4_endpoint(endpoint);
  const sockaddr_in from = tcp::ipv4_address(config_.local_addr, 0);
  const std::string who = rank_name(peer) + " at " + endpoint;
  int backoff_ms = 10;
  for (;;) {
    throw_if_aborted();
    Fd fd = tcp::open_stream_socket(config_.mptcp);
    tcp::tune_socket(fd.get(), config_.socket_buffer_bytes);
    // Bind the source address so this rail's traffic leaves on this rail's interface. The port is
    // left to connect(), which may reuse one per destination: bind() choosing it scans every bound
    // port of the address (thousands for a large job on one host: seconds of kernel time at 128
    // ranks). Best effort: a kernel or an MPTCP socket without the option just binds as before.
    const int no_port = 1;
    (void)::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &no_port, sizeof no_port);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0)
      throw NezhaError("cannot bind source address " + config_.local_addr + " to reach " + who + ": " +
                       tcp::errno_text(errno));
    const int err = tcp::connect_with_deadline(fd.get(), to, abort_fd_.get(), deadline);
    if (err == ECANCELED) throw_if_aborted();
    if (err != 0) {
      if (retryable_connect_error(err) && !deadline.expired()) {
        bool woken = false;
        tcp::poll_one(abort_fd_.get(), POLLIN, -1,
                      earlier(deadline, Deadline::after_seconds(backoff_ms / 1000.0)), &woken);
        backoff_ms = std::min(backoff_ms * 2, 500);
        continue;
      }
      throw NezhaError("cannot connect to " + who + ": " + tcp::errno_text(err));
    }

    const Deadline step = earlier(deadline, Deadline::after_seconds(config_.handshake_timeout_s));
    ConnectorHandshake handshake(HandshakeParams{config_.secret, rank_, size_, config_.rail_index}, peer);
    std::string payload;
    auto expect = [&](FrameType type) {
      const FrameHeader h = tcp::read_frame(fd.get(), kMaxHandshakePayloadBytes, &payload, abort_fd_.get(), step);
      if (h.type != type)
        throw ProtocolError(std::string("got a ") + frame_type_name(h.type) + " frame where a " +
                            frame_type_name(type) + " was expected");
    };
    try {
      tcp::write_frame(fd.get(), FrameType::kHello, handshake.hello(), abort_fd_.get(), step);
      expect(FrameType::kChallenge);
      std::string response;
      try {
        response = handshake.on_challenge(payload);
      } catch (const AuthenticationError&) {
        try {  // tell the acceptor why we hang up, so its log names the problem too
          tcp::write_frame(fd.get(), FrameType::kAuthResult, auth_result_payload(false), -1,
                           Deadline::after_seconds(0.1));
        } catch (...) {
        }
        throw;
      }
      tcp::write_frame(fd.get(), FrameType::kAuthResponse, response, abort_fd_.get(), step);
      expect(FrameType::kAuthResult);
      handshake.on_result(payload);
    } catch (const SocketFailure& f) {
      if (f.err == ECANCELED) throw_if_aborted();
      throw NezhaError("handshake with " + who + " failed: " +
                       (f.err == ETIMEDOUT ? "no answer within " + std::to_string(config_.handshake_timeout_s) + " s"
                                           : f.describe()));
    } catch (const ProtocolError& e) {
      throw NezhaError("handshake with " + who + " failed: " + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    peers_[peer].fd = std::move(fd);
    watched_fds_[peer].store(peers_[peer].fd.get(), std::memory_order_release);
    reachable_[peer].store(true, std::memory_order_release);
    return;
  }
}

void TcpRail::connect(const std::vector<std::string>& listen_addrs_by_rank, const Deadline& deadline) {
  if (static_cast<int>(listen_addrs_by_rank.size()) != size_)
    throw InvalidArgument("rail " + config_.name + ": connect() got " +
                          std::to_string(listen_addrs_by_rank.size()) + " addresses for " +
                          std::to_string(size_) + " ranks");
  addressed_peers_.clear();
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_ && !listen_addrs_by_rank[peer].empty()) addressed_peers_.push_back(peer);
  if (config_.connect_on_first_use) {
    std::lock_guard<std::mutex> lock(mu_);
    endpoints_ = listen_addrs_by_rank;
    for (int peer = 0; peer < size_; ++peer)
      reachable_[peer].store(peer != rank_ && !endpoints_[peer].empty(), std::memory_order_release);
    Fd probe = tcp::open_stream_socket(config_.mptcp);
    tcp::tune_socket(probe.get(), config_.socket_buffer_bytes);
    send_buffer_bytes_.store(usable_send_buffer(probe.get()));
    return;
  }
  std::vector<std::string> failures;  // "rank P: why"
  // An empty address: a peer left out of the mesh (message_path.h), neither dialed nor awaited.
  const auto left_out = [&](int peer) { return listen_addrs_by_rank[peer].empty(); };
  for (int peer = 0; peer < rank_; ++peer) {
    if (left_out(peer)) continue;
    try {
      connect_to(peer, listen_addrs_by_rank[peer], deadline);
    } catch (const NezhaError& e) {
      throw_if_aborted();
      failures.push_back(e.what());
    }
  }

  std::unique_lock<std::mutex> lock(mu_);
  auto all_higher_admitted = [&] {
    for (int peer = rank_ + 1; peer < size_; ++peer)
      if (!left_out(peer) && !peers_[peer].fd.valid()) return false;
    return true;
  };
  // Bounded slices rather than wait_until(deadline): Deadline::never() is time_point::max.
  while (failures.empty() && !all_higher_admitted() && !aborted_ && !deadline.expired())
    admitted_.wait_for(lock, std::chrono::milliseconds(deadline.remaining_ms()));
  admitting_ = false;
  for (int peer = rank_ + 1; peer < size_; ++peer)
    if (!left_out(peer) && !peers_[peer].fd.valid())
      failures.push_back(rank_name(peer) + " never connected to " + listen_address_);
  size_t buffer = SIZE_MAX;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !peers_[peer].fd.valid()) continue;
    buffer = std::min(buffer, usable_send_buffer(peers_[peer].fd.get()));
  }
  send_buffer_bytes_.store(buffer == SIZE_MAX ? 0 : buffer);
  lock.unlock();
  throw_if_aborted();
  if (!failures.empty()) {
    std::ostringstream msg;
    msg << "rail " << config_.name << ": rank " << rank_ << " could not connect to all ranks: ";
    for (size_t i = 0; i < failures.size(); ++i) msg << (i ? "; " : "") << failures[i];
    throw NezhaError(msg.str());
  }
}

void TcpRail::throw_if_aborted() const {
  if (!aborted_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw NezhaError("rail " + config_.name + " aborted: " + abort_reason_);
}

void TcpRail::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    admitted_.notify_all();
  }
  const uint64_t one = 1;
  if (::write(abort_fd_.get(), &one, sizeof one) < 0) {
    // Only fails on counter overflow, i.e. the eventfd is already readable.
  }
}

RailCounters TcpRail::counters() const {
  return RailCounters{bytes_sent_.load(std::memory_order_relaxed),
                      bytes_received_.load(std::memory_order_relaxed)};
}

int TcpRail::live_fd(int peer, const char* what) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw InvalidArgument("rail " + config_.name + ": cannot " + what + " rank " + std::to_string(peer) +
                          " from rank " + std::to_string(rank_) + " of " + std::to_string(size_));
  Peer& p = peers_[peer];
  if (!p.fd.valid())
    throw PeerError(peer, "rail " + config_.name + ": no connection to " + rank_name(peer) + ": " +
                              (p.closed_reason.empty() ? "connect() has not connected it"
                                                       : "closed after an earlier error: " + p.closed_reason));
  return p.fd.get();
}

void TcpRail::close_peer(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  {
    std::lock_guard<std::mutex> lock(mu_);  // admit() may be looking at it (connect_on_first_use)
    if (p.closed_reason.empty()) p.closed_reason = why;
    reachable_[peer].store(false, std::memory_order_release);
    watched_fds_[peer].store(-1, std::memory_order_release);
    p.fd.reset();
  }
  p.control_in.drop_partial();
  NZ_LOG(Debug) << why;
}

void TcpRail::connect_on_first_use(int peer, const Deadline& deadline) {
  if (!config_.connect_on_first_use || peer < 0 || peer >= size_ || peer == rank_) return;
  std::string endpoint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Peer& p = peers_[peer];
    if (p.fd.valid() || !p.closed_reason.empty() || endpoints_.empty()) return;  // live_fd says why
    endpoint = endpoints_[peer];
  }
  if (peer < rank_) {
    try {
      connect_to(peer, endpoint, deadline);
    } catch (const NezhaError& e) {
      throw_if_aborted();
      close_peer(peer, "rail " + config_.name + ": " + e.what());
      throw PeerError(peer, "rail " + config_.name + ": " + e.what());
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!peers_[peer].fd.valid() && !aborted_ && !deadline.expired())
    admitted_.wait_for(lock, std::chrono::milliseconds(std::min(deadline.remaining_ms(), 100)));
  const bool connected = peers_[peer].fd.valid();
  lock.unlock();
  throw_if_aborted();
  if (!connected)
    throw TimeoutError(peer, "rail " + config_.name + ": " + rank_name(peer) + " never connected to " +
                                 listen_address_ + " (its first transfer with rank " +
                                 std::to_string(rank_) + ")");
}

void TcpRail::fail_peer(int peer, const std::string& what) {
  close_peer(peer, what);
  throw PeerError(peer, what);
}

void TcpRail::transfer(Outgoing* out, Incoming* in, const Deadline& deadline) {
  const auto start = Clock::now();
  // Dial before waiting to be dialed: a rank waiting for a higher one never holds up a lower one
  // that waits for it (a ring's first sendrecv would otherwise connect one pair at a time).
  int peers[2] = {out ? out->peer : -1, in ? in->peer : -1};
  if (peers[0] > peers[1]) std::swap(peers[0], peers[1]);  // lower ranks are the ones this rank dials
  for (int peer : peers)
    if (peer >= 0) connect_on_first_use(peer, deadline);
  const int out_fd = out ? live_fd(out->peer, "send to") : -1;
  const int in_fd = in ? live_fd(in->peer, "receive from") : -1;
  for (;;) {
    throw_if_aborted();
    if (out && !out->sender.done()) {
      try {
        bytes_sent_.fetch_add(out->sender.progress(out_fd), std::memory_order_relaxed);
      } catch (const SocketFailure& f) {
        fail_peer(out->peer, "rail " + config_.name + ": sending to " + rank_name(out->peer) +
                                 " failed (tag " + format_tag(out->tag) + "): " + f.describe());
      }
    }
    if (in && !in->receiver.done()) {
      try {
        bytes_received_.fetch_add(in->receiver.progress(in_fd, in->on_header), std::memory_order_relaxed);
      } catch (const SocketFailure& f) {
        fail_peer(in->peer, "rail " + config_.name + ": receiving from " + rank_name(in->peer) +
                                " failed (tag " + format_tag(in->tag) + "): " + f.describe());
      } catch (const ProtocolError& e) {
        close_peer(in->peer, e.what());
        throw;
      }
    }
    const bool sending = out && !out->sender.done();
    const bool receiving = in && !in->receiver.done();
    if (!sending && !receiving) return;

    if (deadline.expired()) {
      // A half-moved frame leaves the stream out of step, so the connection cannot be reused.
      const int peer = receiving ? in->peer : out->peer;
      std::string what = "rail " + config_.name + ": timed out after " + seconds_since(start) +
                         " s waiting for " + rank_name(peer) + " (tag " +
                         format_tag(receiving ? in->tag : out->tag) + ")";
      if (receiving)
        what += in->receiver.started() ? "; " + std::to_string(in->receiver.payload_received()) +
                                             " payload bytes of the frame received"
                                       : "; no frame started";
      if (sending) close_peer(out->peer, what);
      if (receiving) close_peer(in->peer, what);
      throw TimeoutError(peer, what);
    }

    pollfd fds[3];
    nfds_t n = 0;
    fds[n++] = {abort_fd_.get(), POLLIN, 0};
    if (sending && receiving && out_fd == in_fd) {
      fds[n++] = {out_fd, POLLIN | POLLOUT, 0};
    } else {
      if (sending) fds[n++] = {out_fd, POLLOUT, 0};
      if (receiving) fds[n++] = {in_fd, POLLIN, 0};
    }
    if (::poll(fds, n, deadline.remaining_ms()) < 0 && errno != EINTR)
      throw NezhaError("rail " + config_.name + ": poll() failed: " + tcp::errno_text(errno));
    // POLLERR/POLLHUP need no special case: the next sendmsg/recv reports the error or EOF.
  }
}

void TcpRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  Outgoing out{peer, tag, FrameSender(FrameType::kData, tag, data, bytes)};
  transfer(&out, nullptr, deadline);
}

namespace {

FrameReceiver::HeaderHandler data_header_handler(int peer, uint64_t tag, void* data, size_t bytes,
                                                 const std::string& rail) {
  return [=](const uint8_t* raw, uint64_t* length) {
    const FrameHeader h = parse_header(raw, peer, rail);
    check_header(h, FrameType::kData, tag, bytes, /*exact=*/true, peer, rail);
    *length = h.length;
    return static_cast<uint8_t*>(data);
  };
}

}  // namespace

void TcpRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  Incoming in{peer, tag, FrameReceiver(), data_header_handler(peer, tag, data, bytes, config_.name)};
  transfer(nullptr, &in, deadline);
}

void TcpRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                            int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                            const Deadline& deadline) {
  Outgoing out{send_peer, send_tag, FrameSender(FrameType::kData, send_tag, send_data, send_bytes)};
  Incoming in{recv_peer, recv_tag, FrameReceiver(),
              data_header_handler(recv_peer, recv_tag, recv_data, recv_bytes, config_.name)};
  transfer(&out, &in, deadline);
}

void TcpRail::send_message(int peer, const std::string& payload, const Deadline& deadline) {
  if (payload.size() > kMaxControlPayloadBytes)
    throw InvalidArgument("rail " + config_.name + ": control message of " + std::to_string(payload.size()) +
                          " bytes to " + rank_name(peer) + " exceeds the " +
                          std::to_string(kMaxControlPayloadBytes) + " byte limit");
  live_fd(peer, "send to");
  const uint64_t seq = peers_[peer].control_sent;
  Outgoing out{peer, seq, FrameSender(FrameType::kControl, seq, payload.data(), payload.size())};
  transfer(&out, nullptr, deadline);
  peers_[peer].control_sent = seq + 1;
}

void TcpRail::read_control(int peer) {
  Peer& p = peers_[peer];
  try {
    bytes_received_.fetch_add(p.control_in.read(p.fd.get(), peer, config_.name, control_ready_),
                              std::memory_order_relaxed);
  } catch (const SocketFailure& f) {
    fail_peer(peer, "rail " + config_.name + ": receiving a control message from " + rank_name(peer) +
                        " failed: " + f.describe());
  } catch (const ProtocolError& e) {
    close_peer(peer, e.what());
    throw;
  }
}

std::optional<TcpRail::Message> TcpRail::recv_message_any(int wake_fd, const Deadline& deadline) {
  auto pop = [this] {
    Message m = std::move(control_ready_.front());
    control_ready_.pop_front();
    return m;
  };
  std::vector<pollfd> fds;
  std::vector<int> fd_peer;
  for (;;) {
    throw_if_aborted();
    if (!control_ready_.empty()) return pop();
    fds.assign({{abort_fd_.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}});  // poll ignores fd -1
    fd_peer.assign(2, -1);
    // Round robin: start after the peer served first last time, so no peer's messages always wait.
    for (int i = 0; i < size_; ++i) {
      const int peer = static_cast<int>((next_control_peer_ + i) % size_);
      if (peer != rank_ && peers_[peer].fd.valid()) {
        fds.push_back({peers_[peer].fd.get(), POLLIN, 0});
        fd_peer.push_back(peer);
      }
    }
    next_control_peer_ = (next_control_peer_ + 1) % size_;
    const int n = ::poll(fds.data(), fds.size(), deadline.remaining_ms());
    if (n < 0 && errno != EINTR)
      throw NezhaError("rail " + config_.name + ": poll() failed: " + tcp::errno_text(errno));
    throw_if_aborted();
    for (size_t i = 2; n > 0 && i < fds.size(); ++i)
      if (fds[i].revents != 0) read_control(fd_peer[i]);
    if (!control_ready_.empty()) return pop();
    if (fds[1].revents & POLLIN) return std::nullopt;
    if (deadline.expired()) return std::nullopt;
  }
}

void TcpRail::read_polled(const pollfd* fds, size_t n, std::vector<Message>& out) {
  auto hand_over = [&] {
    for (Message& m : control_ready_) out.push_back(std::move(m));
    control_ready_.clear();
  };
  try {
    throw_if_aborted();
    for (size_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0 || fds[i].fd < 0) continue;
      for (int peer : addressed_peers_)  // a few peers: a scan beats a map
        if (peers_[peer].fd.valid() && peers_[peer].fd.get() == fds[i].fd) {
          read_control(peer);
          break;
        }
    }
  } catch (...) {
    hand_over();
    throw;
  }
  hand_over();
}

void TcpRail::append_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({abort_fd_.get(), POLLIN, 0});
  for (int peer : addressed_peers_)
    if (peers_[peer].fd.valid()) fds.push_back({peers_[peer].fd.get(), POLLIN, 0});
}

void TcpRail::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int peer = 0; peer < size_; ++peer) {
    reachable_[peer].store(false, std::memory_order_release);
    watched_fds_[peer].store(-1, std::memory_order_release);
  }
  for (Peer& p : peers_) {
    p.fd.reset();
    p.closed_reason.clear();
    p.control_sent = 0;
    p.control_in.reset();
  }
  control_ready_.clear();
  uint64_t drained;
  while (::read(abort_fd_.get(), &drained, sizeof drained) > 0) {
  }
  abort_reason_.clear();
  aborted_.store(false, std::memory_order_release);
  admitting_ = true;
  endpoints_.clear();
}

void TcpRail::close() {
  abort("rail closed");
  if (acceptor_) acceptor_->stop();
  for (int peer = 0; peer < size_; ++peer) {
    reachable_[peer].store(false, std::memory_order_release);
    watched_fds_[peer].store(-1, std::memory_order_release);
  }
  for (Peer& p : peers_) p.fd.reset();
}

bool TcpRail::delivering(std::chrono::milliseconds quiet) const {
  // TCP_INFO of each connection: data the peer's kernel has not acknowledged for `quiet` means a
  // path that drops packets (a cut beyond this host's own link, a link throttled to nothing); all
  // acknowledged (the peer's window may be full: it is late or busy) means the path works. The fd
  // may be closed (and its number reused) while this reads: a stale answer only delays a report.
  bool any = false;
  for (int peer = 0; peer < size_; ++peer) {
    const std::optional<bool> acked = tcp::acknowledges(watched_fds_[peer].load(std::memory_order_acquire), quiet);
    if (!acked) continue;
    if (!*acked) return false;
    any = true;
  }
  return any;
}

}  // namespace nezha::transport
