#include "engine/negotiation/control_channel.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <unordered_set>
#include <utility>

#include <cerrno>
#include <cstring>

#include "common/epoll_add.h"
#include "common/error.h"
#include "common/logging.h"
#include "transport/rail_factory.h"

namespace nezha::engine {
namespace {

constexpr double kSendAttemptS = 2.0;     // a path whose socket buffer stays full this long is dead
constexpr size_t kEnvelopeBytes = 32;     // message number, acknowledgement, route version, mover
constexpr size_t kRouteAt = 16;           // where the route starts in an envelope
constexpr size_t kMaxEarly = 1u << 16;    // messages held ahead of a gap, per peer
// Unacknowledged this long, a message is presumed lost under a cut: bare acknowledgements go out
// after kAckDelay, so this leaves room for a loaded machine's scheduling delays.
constexpr auto kAckDelay = std::chrono::milliseconds(10);
// What arrived on a reliable path (shared memory) is never resent on a timeout, so its bare
// acknowledgement only frees the sender's copies: it waits as long as the loop's idle wake-up
// (kIdleWakeS), and the next message usually carries it first. With 10 ms, a rank whose operations
// take longer (128 ranks on 2 cores: 5-10 ms each) had its loop thread woken for it on every call.
constexpr auto kReliableAckDelay = std::chrono::seconds(1);
constexpr auto kAckTimeout = std::chrono::milliseconds(100);
constexpr auto kMaxAckTimeout = std::chrono::milliseconds(3200);
// While a message is unacknowledged, its path's link (carrier) is checked this often: a pulled
// cable under the control path then costs this, not the ack timeout.
constexpr auto kLinkCheck = std::chrono::milliseconds(10);
constexpr uint64_t kBareAck = ~uint64_t{0};  // message number of an acknowledgement alone

uint64_t read_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

void append_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

}  // namespace

transport::MessagePath::HostBoard ControlChannel::host_board(bool* reaches_everyone) const {
  for (const auto& path : paths_) {
    transport::MessagePath::HostBoard board = path->host_board();
    if (board.base == nullptr) continue;
    bool all = true;
    for (int r = 0; r < size_ && all; ++r) all = r == rank_ || path->reaches(r);
    *reaches_everyone = all;
    return board;
  }
  *reaches_everyone = false;
  return {};
}

ControlChannel::ControlChannel(const std::vector<ControlPathConfig>& paths, const std::string& secret,
                               int rank, int size, size_t socket_buffer_bytes, size_t host_board_bytes)
    : rank_(rank), size_(size), avoided_(paths.size(), false), black_hole_(paths.size(), false),
      testing_link_faults_(paths.size()), links_(paths.size()),
      peers_(size), linked_(size, false) {
  if (paths.empty()) throw InvalidArgument("the control channel needs at least one rail");
  for (size_t i = 0; i < paths.size(); ++i) {
    transport::RailSpec spec;
    spec.kind = paths[i].kind;
    spec.name = "control/" + paths[i].name;
    spec.local_addr = paths[i].local_addr;
    transport::RailContext ctx;
    ctx.rank = rank;
    ctx.size = size;
    ctx.rail_index = -1 - static_cast<int>(i);  // control paths never cross-connect with data rails
    ctx.socket_buffer_bytes = socket_buffer_bytes;
    ctx.secret = secret;
    ctx.host_id = paths[i].host_id;
    ctx.host_board_bytes = host_board_bytes;
    names_.push_back(spec.name);
    paths_.push_back(transport::make_message_path(spec, ctx));
  }
  for (bool reliable : {true, false})
    for (size_t i = 0; i < paths_.size(); ++i)
      if (paths_[i]->reliable() == reliable) order_.push_back(static_cast<int>(i));
  for (auto& p : peers_) {
    p.broken.assign(paths_.size(), false);
    p.ack_timeout = kAckTimeout;
  }
  watch_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (watch_fd_ < 0) throw NezhaError(std::string("control channel: epoll_create1 failed: ") + std::strerror(errno));
}

ControlChannel::~ControlChannel() { ::close(watch_fd_); }

void ControlChannel::sync_watch(const std::vector<pollfd>& fds, const std::vector<size_t>& first_fd) {
  // In step already, the usual case on every call: no allocation, no system call.
  if (watched_.size() + 1 == fds.size() &&
      std::equal(watched_.begin(), watched_.end(), fds.begin() + 1, [](int fd, const pollfd& p) { return fd == p.fd; }))
    return;
  std::vector<int> now;
  for (size_t k = 1; k < fds.size(); ++k) now.push_back(fds[k].fd);
  std::unordered_set<int> before(watched_.begin(), watched_.end()), after(now.begin(), now.end());
  // A closed descriptor has left the epoll set by itself (the DEL then fails, harmlessly). A path
  // gains no descriptor after connect_all(), so a number reused between two calls (which this
  // comparison could not see) is never one of ours.
  for (int fd : watched_)
    if (fd >= 0 && !after.count(fd)) ::epoll_ctl(watch_fd_, EPOLL_CTL_DEL, fd, nullptr);
  for (int fd : now) {
    if (fd < 0 || before.count(fd)) continue;
    if (epoll_add_readable(watch_fd_, fd) != 0 && errno == EEXIST) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      ::epoll_ctl(watch_fd_, EPOLL_CTL_MOD, fd, &ev);
    }
  }
  path_of_fd_.clear();
  for (size_t i = 0; i + 1 < first_fd.size(); ++i)
    for (size_t k = first_fd[i]; k < first_fd[i + 1]; ++k) path_of_fd_[fds[k].fd] = static_cast<int>(i);
  watched_ = std::move(now);
  events_.resize(std::max<size_t>(1, watched_.size()));
}

std::vector<std::string> ControlChannel::listen_addresses() const {
  std::vector<std::string> out;
  for (const auto& p : paths_) out.push_back(p->local_address());
  return out;
}

void ControlChannel::connect_all(const std::vector<std::vector<std::string>>& addrs,
                                 const Deadline& deadline) {
  if (addrs.size() != paths_.size())
    throw InvalidArgument("control channel: " + std::to_string(addrs.size()) + " address columns for " +
                          std::to_string(paths_.size()) + " paths");
  linked_peers_.clear();
  for (int peer = 0; peer < size_; ++peer) {
    linked_[peer] = peer != rank_ && !addrs[0].at(static_cast<size_t>(peer)).empty();
    if (linked_[peer]) linked_peers_.push_back(peer);
  }
  for (size_t i = 0; i < paths_.size(); ++i) paths_[i]->connect(addrs[i], deadline);
  // A path that does not reach a peer (shared memory, another host) is as good as broken for it.
  for (int peer = 0; peer < size_; ++peer) {
    if (!linked_[peer]) continue;
    PeerState& p = peers_[peer];
    for (size_t i = 0; i < paths_.size(); ++i)
      if (!paths_[i]->reaches(peer)) p.broken[i] = true;
    p.path = pick_path(p, false);
    if (p.path < 0) throw PeerError(peer, "no control path reaches rank " + std::to_string(peer));
  }
}

bool ControlChannel::readable_now() const {
  if (!ready_.empty()) return true;
  for (const auto& p : paths_)
    if (p->readable_now()) return true;
  return false;
}

void ControlChannel::wake_after_messages(int messages) {
  for (auto& p : paths_) p->wake_after_messages(messages);
}

int ControlChannel::pick_path(const PeerState& p, bool after_current, bool any_path) const {
  const int n = static_cast<int>(paths_.size());
  const int current = p.path >= 0 ? static_cast<int>(std::find(order_.begin(), order_.end(), p.path) - order_.begin()) : -1;
  const int start = after_current && current >= 0 ? current + 1 : 0;
  for (bool allow_avoided : {any_path, true})
    for (int i = 0; i < n; ++i) {
      int path = order_[static_cast<size_t>((start + i) % n)];
      if (!p.broken[path] && (allow_avoided || !avoided_[path])) return path;
    }
  return -1;
}

void ControlChannel::move_peer(int peer, const std::string& why, bool after_current, bool any_path) {
  PeerState& p = peers_[peer];
  const int path = pick_path(p, after_current, any_path);
  if (path < 0) {
    p.path = -1;
    throw PeerError(peer, "every control path to rank " + std::to_string(peer) + " failed; last: " +
                              p.last_error);
  }
  if (path != p.path) p.route = {p.route.version + 1, static_cast<uint64_t>(rank_)};
  set_path(peer, path, why);
}

void ControlChannel::set_path(int peer, int path, const std::string& why) {
  PeerState& p = peers_[peer];
  if (p.path != path)
    NZ_LOG(Info) << "rank " << rank_ << ": control messages to rank " << peer << " move from '"
                 << (p.path >= 0 ? names_[p.path] : "-") << "' to '" << names_[path] << "': " << why;
  p.path = path;
}

void ControlChannel::flush(int peer, size_t from) {
  PeerState& p = peers_[peer];
  size_t i = from;
  while (i < p.unacked.size()) {
    if (p.path < 0) move_peer(peer, "no path", false);  // throws
    try {
      send_on_path(peer, p.unacked[i].envelope);
      p.unacked[i].sent_at = Clock::now();
      ++i;
    } catch (const ProtocolError&) {
      throw;
    } catch (const NezhaError& e) {  // reset, timeout (buffer full), or that path aborted
      if (aborted_) throw;
      p.broken[p.path] = true;
      p.last_error = e.what();
      move_peer(peer, e.what(), true);
      i = 0;  // the new path gets everything the peer has not acknowledged, in order
    }
  }
}

void ControlChannel::follow(int peer, int path, const Route& route) {
  PeerState& p = peers_[peer];
  if (!(p.route < route)) return;  // sent before a move we know of (in flight on the old path)
  p.route = route;
  // Onto an avoided path too: the peer reached us there, after its preferred ones failed it.
  if (path != p.path && !p.broken[path]) {
    set_path(peer, path, "rank " + std::to_string(peer) + " talks there");
    flush(peer, 0);  // what is unacknowledged may have been lost on the old path
  }
}

void ControlChannel::send_on_path(int peer, std::string& envelope) {
  const PeerState& p = peers_[peer];
  std::memcpy(envelope.data() + kRouteAt, &p.route.version, 8);
  std::memcpy(envelope.data() + kRouteAt + 8, &p.route.mover, 8);
  const int path = p.path;
  if (black_hole_[path]) return;
  paths_[path]->send_message(peer, envelope, Deadline::after_seconds(kSendAttemptS));
  (paths_[path]->reliable() ? sent_reliable_ : sent_other_).fetch_add(1, std::memory_order_relaxed);
}

void ControlChannel::send_bare_ack(int peer) {
  PeerState& p = peers_[peer];
  std::string envelope;
  append_u64(envelope, kBareAck);
  append_u64(envelope, p.next_recv);
  envelope.resize(kEnvelopeBytes);  // the route: stamped when sent
  try {
    send_on_path(peer, envelope);
    p.ack_owed_since.reset();
  } catch (const ProtocolError&) {
    throw;
  } catch (const NezhaError& e) {
    if (aborted_) throw;
    path_failed(p.path, peer, e.what());  // owed still: the next run goes on the new path
  }
}

std::optional<Clock::time_point> ControlChannel::run_timers(Clock::time_point now) {
  std::optional<Clock::time_point> next;
  auto consider = [&next](Clock::time_point t) { next = next ? std::min(*next, t) : t; };
  // Each path's link, read only for paths carrying unacknowledged messages, and at most every
  // kLinkCheck: a small operation's request is unacknowledged on every run until its response, and
  // reading a carrier is a system call.
  auto fault_of = [&](int path) -> const std::string& {
    if (!testing_link_faults_[path].empty()) return testing_link_faults_[path];
    LinkCheck& link = links_[path];
    if (!link.checked || now - link.at >= kLinkCheck) link = {true, now, paths_[path]->link_fault()};
    return link.fault;
  };
  for (int peer : linked_peers_) {  // only linked peers are ever sent to or heard from
    PeerState& p = peers_[peer];
    if (!p.unacked.empty() && p.path >= 0 && !fault_of(p.path).empty()) {
      // This rank's own link of the path is gone: move now if the next path's link is up (else the
      // ack timeout below moves through every path in turn, as it would without a carrier check).
      const int to = pick_path(p, true);
      if (to >= 0 && to != p.path && fault_of(to).empty()) {
        move_peer(peer, "rail '" + names_[p.path].substr(8) + "': " + fault_of(p.path), true);
        flush(peer, 0);
      }
    }
    // On a reliable path a message is late, never lost: moving would only leave the fast path.
    if (!p.unacked.empty() && now - p.unacked.front().sent_at >= p.ack_timeout && p.path >= 0 &&
        !paths_[p.path]->reliable()) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.unacked.front().sent_at);
      p.ack_timeout = std::min<Clock::duration>(2 * p.ack_timeout, kMaxAckTimeout);
      // Every path in turn, avoided ones too: a rail marked down by mistake (a false stall on an
      // overloaded machine) may be the only one that works while the other is cut.
      move_peer(peer, "a message unacknowledged for " + std::to_string(waited.count()) + " ms", true,
                /*any_path=*/true);
      flush(peer, 0);  // restarts the clock of every message it resends
    }
    if (p.ack_owed_since && now - *p.ack_owed_since >= ack_delay_of(p)) send_bare_ack(peer);
    if (auto t = next_timer_of(p, now)) consider(*t);
  }
  return next;
}

std::optional<Clock::time_point> ControlChannel::next_timer_of(const PeerState& p, Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  const bool reliable = p.path >= 0 && paths_[p.path]->reliable();  // no ack timeout, no link to check
  if (!p.unacked.empty() && !reliable) next = std::min(p.unacked.front().sent_at + p.ack_timeout, now + kLinkCheck);
  if (p.ack_owed_since) {
    const Clock::time_point due = *p.ack_owed_since + ack_delay_of(p);
    next = next ? std::min(*next, due) : due;
  }
  return next;
}

Clock::duration ControlChannel::ack_delay_of(const PeerState& p) {
  return p.ack_owed_reliable ? Clock::duration(kReliableAckDelay) : Clock::duration(kAckDelay);
}

std::optional<Clock::time_point> ControlChannel::next_timer(Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  for (int peer : linked_peers_)
    if (auto t = next_timer_of(peers_[peer], now)) next = next ? std::min(*next, *t) : *t;
  return next;
}

void ControlChannel::send(int peer, const std::string& payload) {
  if (peer < 0 || peer >= size_ || !linked_[peer])
    throw InvalidArgument("control channel: rank " + std::to_string(rank_) + " has no connection to rank " +
                          std::to_string(peer));
  PeerState& p = peers_[peer];
  p.ack_owed_since.reset();  // this message carries the acknowledgement
  std::string envelope;
  envelope.reserve(kEnvelopeBytes + payload.size());
  append_u64(envelope, p.next_send);
  append_u64(envelope, p.next_recv);
  envelope.resize(kEnvelopeBytes);  // the route: stamped when sent, so resends carry the current one
  envelope += payload;
  p.unacked.push_back({p.next_send++, std::move(envelope), Clock::now()});
  flush(peer, p.unacked.size() - 1);
}

void ControlChannel::on_envelope(int peer, int path, std::string envelope) {
  PeerState& p = peers_[peer];
  if (envelope.size() < kEnvelopeBytes)
    throw ProtocolError("control message from rank " + std::to_string(peer) + " has no envelope");
  const uint64_t number = read_u64(envelope, 0), ack = read_u64(envelope, 8);
  if (ack > p.next_send)
    throw ProtocolError("rank " + std::to_string(peer) + " acknowledged control message " +
                        std::to_string(ack) + " of " + std::to_string(p.next_send) + " sent");
  if (!p.unacked.empty() && p.unacked.front().number < ack) {
    while (!p.unacked.empty() && p.unacked.front().number < ack) p.unacked.pop_front();
    p.ack_timeout = kAckTimeout;  // the path works
  }
  const Route route{read_u64(envelope, kRouteAt), read_u64(envelope, kRouteAt + 8)};
  if (route.mover >= static_cast<uint64_t>(size_))
    throw ProtocolError("rank " + std::to_string(peer) + " sent a control message whose path was moved by " +
                        "rank " + std::to_string(route.mover) + " of " + std::to_string(size_));
  follow(peer, path, route);
  if (number == kBareAck) return;
  // Duplicates too: the sender resent. Owed for a message from a network path, the short delay.
  if (!p.ack_owed_since) {
    p.ack_owed_since = Clock::now();
    p.ack_owed_reliable = paths_[static_cast<size_t>(path)]->reliable();
  } else {
    p.ack_owed_reliable = p.ack_owed_reliable && paths_[static_cast<size_t>(path)]->reliable();
  }
  if (number < p.next_recv) return;  // a duplicate, sent again after a path switch
  std::string payload = envelope.substr(kEnvelopeBytes);
  if (number > p.next_recv) {
    if (p.early.size() >= kMaxEarly)
      throw ProtocolError("rank " + std::to_string(peer) + ": too many control messages ahead of a gap");
    p.early.emplace(number, std::move(payload));
    return;
  }
  ready_.push_back({peer, std::move(payload)});
  ++p.next_recv;
  for (auto it = p.early.find(p.next_recv); it != p.early.end(); it = p.early.find(p.next_recv)) {
    ready_.push_back({peer, std::move(it->second)});
    p.early.erase(it);
    ++p.next_recv;
  }
}

std::optional<transport::MessagePath::Message> ControlChannel::take_ready() {
  if (ready_.empty()) return std::nullopt;
  transport::MessagePath::Message m = std::move(ready_.front());
  ready_.pop_front();
  return m;
}

std::optional<transport::MessagePath::Message> ControlChannel::recv_any(int wake_fd, const Deadline& deadline,
                                                                        const Wait& wait) {
  auto pop = [this] {
    transport::MessagePath::Message m = std::move(ready_.front());
    ready_.pop_front();
    return m;
  };
  if (!ready_.empty()) return pop();
  if (deferred_error_) std::rethrow_exception(std::exchange(deferred_error_, nullptr));
  // Losing the last path to a peer is reported only after what it sent before is delivered: a
  // rank's last words (rank 0's fatal error naming a dead rank) come just before its close.
  auto fail_path = [this](int path, int peer, const std::string& why) {
    try {
      path_failed(path, peer, why);
    } catch (const PeerError&) {
      if (ready_.empty()) throw;
      deferred_error_ = std::current_exception();
    }
  };
  std::vector<pollfd> fds;
  std::vector<size_t> first_fd(paths_.size() + 1);  // path i's fds: [first_fd[i], first_fd[i + 1])
  std::vector<std::vector<pollfd>> ready_fds(paths_.size());
  std::vector<transport::MessagePath::Message> got;
  // The first pass reads what has already arrived before the timers judge anything: the engine may
  // not have called for a while, and the acknowledgements may be waiting in the sockets.
  int timeout_ms = 0;
  for (;;) {
    fds.assign({{wake_fd, POLLIN, 0}});
    for (size_t i = 0; i < paths_.size(); ++i) {
      first_fd[i] = fds.size();
      paths_[i]->append_poll_fds(fds);
    }
    first_fd[paths_.size()] = fds.size();
    sync_watch(fds, first_fd);
    if (wait && timeout_ms > 0) {
      if (wait(timeout_ms)) return std::nullopt;
      timeout_ms = 0;  // readiness is collected below, without blocking
    }
    // Waits on the wake fd and the epoll set, then takes only the ready descriptors from it: a
    // poll() over every connection costs each message O(peers) in the kernel, O(n^2) per rank
    // for a round in which every peer sends one.
    // Without a wake fd (a caller leading the loop) the epoll set alone: one system call, not two.
    pollfd waits[2] = {{wake_fd, POLLIN, 0}, {watch_fd_, POLLIN, 0}};
    int n = 0, ready = 0;
    if (wake_fd < 0) {
      ready = ::epoll_wait(watch_fd_, events_.data(), static_cast<int>(events_.size()), timeout_ms);
      if (ready < 0 && errno != EINTR)
        throw NezhaError(std::string("control channel: epoll_wait() failed: ") + std::strerror(errno));
      ready = std::max(ready, 0);
    } else {
      n = ::poll(waits, 2, timeout_ms);
      if (n < 0 && errno != EINTR) throw NezhaError(std::string("control channel: poll() failed: ") + std::strerror(errno));
      ready = n > 0 && (waits[1].revents & POLLIN)
                  ? ::epoll_wait(watch_fd_, events_.data(), static_cast<int>(events_.size()), 0)
                  : 0;
    }
    for (auto& r : ready_fds) r.clear();
    for (int e = 0; e < ready; ++e) {
      const auto at = path_of_fd_.find(events_[e].data.fd);
      if (at == path_of_fd_.end()) continue;  // closed since it was registered
      const uint32_t ev = events_[e].events;
      const short revents = static_cast<short>(((ev & EPOLLIN) ? POLLIN : 0) | ((ev & EPOLLHUP) ? POLLHUP : 0) |
                                               ((ev & EPOLLERR) ? POLLERR : 0));
      ready_fds[static_cast<size_t>(at->second)].push_back({events_[e].data.fd, POLLIN, revents});
    }
    for (size_t i = 0; i < paths_.size(); ++i) {
      if (ready_fds[i].empty()) continue;
      got.clear();
      int failed_peer = -1;  // its socket is closed now; the others are served next pass
      bool path_aborted = false;
      std::string why;
      try {
        paths_[i]->read_polled(ready_fds[i].data(), ready_fds[i].size(), got);
      } catch (const PeerError& e) {
        failed_peer = e.peer();
        why = e.what();
      } catch (const ProtocolError&) {
        throw;
      } catch (const NezhaError& e) {
        if (aborted_) throw;
        path_aborted = true;
        why = e.what();
      }
      // What arrived before a failure is delivered first: it may be the peer's last words.
      if (!black_hole_[i])  // (tests: lost under the cut)
        for (auto& m : got) on_envelope(m.peer, static_cast<int>(i), std::move(m.payload));
      if (failed_peer >= 0) fail_path(static_cast<int>(i), failed_peer, why);
      for (int peer = 0; path_aborted && peer < size_; ++peer)
        if (linked_[peer] && !peers_[peer].broken[i]) fail_path(static_cast<int>(i), peer, why);
    }
    if (!ready_.empty()) return pop();
    if (n > 0 && (waits[0].revents & POLLIN)) return std::nullopt;
    const Clock::time_point now = Clock::now();
    const std::optional<Clock::time_point> timer = run_timers(now);
    if (deadline.expired()) return std::nullopt;
    timeout_ms = deadline.remaining_ms();  // capped at 1 s
    if (timer) {
      const auto until = std::chrono::ceil<std::chrono::milliseconds>(*timer - now).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(until, 0, timeout_ms));
    }
  }
}

void ControlChannel::path_failed(int path, int peer, const std::string& why) {
  PeerState& p = peers_[peer];
  p.broken[path] = true;
  p.last_error = why;
  if (p.path == path) {
    move_peer(peer, why, true);
    flush(peer, 0);
  } else if (pick_path(p, false) < 0) {
    move_peer(peer, why, false);  // throws: nothing left
  }
}

void ControlChannel::avoid_path(int path, bool avoid) {
  if (path < 0 || path >= static_cast<int>(paths_.size()) || avoided_[path] == avoid) return;
  avoided_[path] = avoid;
  if (!avoid) return;  // peers stay where they are; the path is a candidate again
  for (int peer = 0; peer < size_; ++peer) {
    if (!linked_[peer] || peers_[peer].path != path) continue;
    move_peer(peer, "rail '" + names_[path].substr(8) + "' is down", true);
    flush(peer, 0);
  }
}

void ControlChannel::switch_path(int peer, const std::string& why) {
  PeerState& p = peers_[peer];
  int before = p.path;
  move_peer(peer, why, true);
  if (p.path != before) flush(peer, 0);
}

void ControlChannel::abort(const std::string& reason) {
  aborted_ = true;
  for (auto& p : paths_) p->abort(reason);
}

void ControlChannel::close() {
  for (auto& p : paths_) p->close();
}

}  // namespace nezha::engine
