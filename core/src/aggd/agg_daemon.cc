#include "aggd/agg_daemon.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <vector>

#include "aggd/agg_job.h"
#include "common/deadline.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/tcp/socket.h"

namespace nezha::aggd {

using namespace transport::agg;
using transport::tcp::errno_text;

namespace {

constexpr size_t kHelloPayloadBytes = 4 + 4 * 4 + transport::kAuthNonceBytes;

std::shared_ptr<const std::string> error_frame(uint64_t job, const std::string& why) {
  AggHeader h;
  h.type = AggType::kError;
  h.job = job;
  const std::string text = why.substr(0, kMaxAggErrorBytes);
  return std::make_shared<const std::string>(encode_agg_frame(h, text.data(), text.size()));
}

std::shared_ptr<const std::string> control_frame(AggType type, uint64_t job, const std::string& payload) {
  AggHeader h;
  h.type = type;
  h.job = job;
  return std::make_shared<const std::string>(encode_agg_frame(h, payload.data(), payload.size()));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

struct AggDaemon::Conn {
  enum class State { kHello, kAuth, kJoin, kJoined, kClosing };
  int fd = -1;
  std::string peer;
  Clock::time_point opened = Clock::now();
  State state = State::kHello;
  std::vector<uint8_t> in;
  size_t in_len = 0;
  struct Out {
    std::shared_ptr<const std::string> frame;
    size_t written = 0;
    bool answers_chunk = false;
  };
  std::deque<Out> out;
  std::unique_ptr<transport::AcceptorHandshake> handshake;
  uint64_t job = 0;
  uint32_t rank = 0;
  uint32_t unanswered = 0;  // chunks sent to us whose result has not been written back yet
  bool dead = false;        // reaped after the current event batch
  bool writable_armed = false;
  size_t max_payload_joined = 0;

  // The largest frame this connection may send now; the buffer only grows (bytes of the next frame
  // may already be in it when the state changes).
  size_t max_payload() const {
    switch (state) {
      case State::kHello:
      case State::kAuth: return transport::kMaxHandshakePayloadBytes;
      case State::kJoin: return kAggJoinBytes;
      default: return max_payload_joined;
    }
  }
  void fit_buffer() {
    const size_t need = kAggHeaderBytes + max_payload();
    if (in.size() < need) in.resize(need);
  }
};

struct AggDaemon::JobEntry {
  std::unique_ptr<AggJob> job;
  std::vector<int> fd_by_rank;  // -1: not connected
  size_t reserved = 0;
  Clock::time_point last_progress = Clock::now();
  Clock::time_point rank_lost_at{};
  int lost_rank = -1;
};

AggDaemon::AggDaemon(AggDaemonOptions options) : opt_(std::move(options)) {
  // ADDR:PORT; port 0 (any free port) is allowed here, unlike a peer's endpoint.
  const size_t colon = opt_.listen.rfind(':');
  int port = -1;
  try {
    if (colon != std::string::npos) port = std::stoi(opt_.listen.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535)
    throw InvalidArgument("nezha-aggd: --listen '" + opt_.listen + "' is not ADDR:PORT");
  const sockaddr_in addr = transport::tcp::ipv4_address(opt_.listen.substr(0, colon), static_cast<uint16_t>(port));
  transport::tcp::Fd fd = transport::tcp::open_stream_socket(false);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
    throw NezhaError("nezha-aggd: cannot bind " + opt_.listen + ": " + errno_text(errno));
  if (::listen(fd.get(), 128) != 0)
    throw NezhaError("nezha-aggd: cannot listen on " + opt_.listen + ": " + errno_text(errno));
  bound_ = transport::tcp::local_endpoint(fd.get());
  port_ = std::stoi(bound_.substr(bound_.rfind(':') + 1));
  listen_fd_ = fd.release();
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw NezhaError("nezha-aggd: epoll/eventfd: " + errno_text(errno));
  for (int f : {listen_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, f, &ev);
  }
}

AggDaemon::~AggDaemon() {
  stop();
  for (auto& [fd, c] : conns_) ::close(fd);
  for (int f : {listen_fd_, epoll_fd_, wake_fd_})
    if (f >= 0) ::close(f);
}

std::string AggDaemon::address() const { return bound_; }

void AggDaemon::start() {
  thread_ = std::thread([this] {
    name_this_thread("nz-aggd");
    run();
  });
}

void AggDaemon::stop() {
  stop_ = true;
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

AggDaemonStats AggDaemon::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  AggDaemonStats s = stats_;
  s.reserved_bytes = reserved_;
  return s;
}

void AggDaemon::run() {
  std::vector<epoll_event> events(64);
  while (!stop_) {
    // Idle: sleep until something arrives. With connections: wake once a second for the timeouts.
    const int timeout_ms = conns_.empty() ? -1 : 1000;
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) throw NezhaError("nezha-aggd: epoll_wait: " + errno_text(errno));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) continue;
      if (fd == listen_fd_) {
        accept_all();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end() || it->second->dead) continue;
      Conn& c = *it->second;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
      if (!c.dead && (events[i].events & EPOLLOUT)) on_writable(c);
    }
    check_timeouts();
    reap_closed();
  }
}

void AggDaemon::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE): try again on the next event
    transport::tcp::tune_socket(fd, size_t{4} << 20);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->peer = transport::tcp::remote_endpoint(fd);
    c->fit_buffer();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    conns_[fd] = std::move(c);
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.connections;
  }
}

void AggDaemon::on_readable(Conn& c) {
  for (int reads = 0; reads < 16 && !c.dead; ++reads) {
    if (c.in_len == c.in.size()) break;  // a whole frame is buffered: handle it first
    const ssize_t got = ::read(c.fd, c.in.data() + c.in_len, c.in.size() - c.in_len);
    if (got == 0) return close_conn(c, "closed the connection");
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return close_conn(c, errno_text(errno));
    }
    c.in_len += static_cast<size_t>(got);
    size_t off = 0;
    try {
      while (!c.dead && c.state != Conn::State::kClosing) {
        const size_t max_payload = c.max_payload();
        AggFrame f;
        const size_t used = decode_agg_frame(c.in.data() + off, c.in_len - off, max_payload, &f);
        if (used == 0) break;
        handle_frame(c, f);
        off += used;
      }
    } catch (const ProtocolError& e) {
      const std::string why = "rank " + std::to_string(c.rank) + " (" + c.peer + "): " + e.what();
      if (c.state == Conn::State::kJoined) fail_job(c.job, why);
      else send_error_and_close(c, e.what());
      return;
    }
    if (c.dead || c.state == Conn::State::kClosing) return;
    if (off) {
      std::memmove(c.in.data(), c.in.data() + off, c.in_len - off);
      c.in_len -= off;
    }
  }
}

void AggDaemon::handle_frame(Conn& c, const AggFrame& f) {
  switch (c.state) {
    case Conn::State::kHello:
    case Conn::State::kAuth:
      return handle_auth(c, f);
    case Conn::State::kJoin:
      if (f.header.type != AggType::kJoin)
        throw ProtocolError(std::string("expected a join, got a ") + agg_type_name(f.header.type) + " frame");
      return handle_join(c, f);
    case Conn::State::kJoined:
      if (f.header.type != AggType::kChunk || f.header.job != c.job || f.header.rank != c.rank)
        throw ProtocolError(std::string("expected a chunk of job ") + std::to_string(c.job) + " from rank " +
                            std::to_string(c.rank) + ", got a " + agg_type_name(f.header.type) +
                            " frame of job " + std::to_string(f.header.job) + " from rank " +
                            std::to_string(f.header.rank));
      return handle_chunk(c, f);
    case Conn::State::kClosing:
      return;
  }
}

void AggDaemon::handle_auth(Conn& c, const AggFrame& f) {
  const std::string payload(reinterpret_cast<const char*>(f.payload), f.header.length);
  try {
    if (c.state == Conn::State::kHello) {
      if (f.header.type != AggType::kHello || payload.size() != kHelloPayloadBytes)
        throw transport::AuthenticationError("expected a hello");
      // The daemon plays rank `size` of the job the hello names; the proofs bind that size.
      const int64_t size = static_cast<int32_t>(transport::get_le(f.payload + 12, 4));
      if (size < 1 || size > static_cast<int64_t>(kMaxAggRanks))
        throw transport::AuthenticationError("hello for a job of " + std::to_string(size) + " ranks");
      transport::HandshakeParams p{opt_.secret, static_cast<int>(size), static_cast<int>(size), kAggRailIndex};
      c.handshake = std::make_unique<transport::AcceptorHandshake>(p);
      queue(c, control_frame(AggType::kChallenge, 0, c.handshake->on_hello(payload)), false);
      c.state = Conn::State::kAuth;
      return;
    }
    c.handshake->on_response(handshake_message(f.header.type), payload);
  } catch (const transport::AuthenticationError& e) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.refused;
    }
    NZ_LOG(Warning) << "nezha-aggd: refused " << c.peer << ": " << e.what();
    queue(c, control_frame(AggType::kAuthResult, 0, transport::auth_result_payload(false)), false);
    c.state = Conn::State::kClosing;
    return;
  }
  queue(c, control_frame(AggType::kAuthResult, 0, transport::auth_result_payload(true)), false);
  c.handshake.reset();
  c.state = Conn::State::kJoin;
  c.fit_buffer();
}

void AggDaemon::handle_join(Conn& c, const AggFrame& f) {
  const AggJoin join = parse_join_payload(f.payload, f.header.length);
  const uint64_t id = f.header.job, epoch = f.header.seq;
  if (f.header.rank >= join.size)
    throw ProtocolError("join as rank " + std::to_string(f.header.rank) + " of " + std::to_string(join.size));
  auto it = jobs_.find(id);
  if (it != jobs_.end()) {
    AggJob& job = *it->second->job;
    if (epoch < job.epoch())
      return send_error_and_close(c, "job " + std::to_string(id) + ": join for epoch " + std::to_string(epoch) +
                                         ", the job is at epoch " + std::to_string(job.epoch()));
    const AggJoin& s = job.shape();
    if (epoch == job.epoch() &&
        (s.size != join.size || s.window != join.window || s.chunk_bytes != join.chunk_bytes)) {
      const std::string why = "rank " + std::to_string(f.header.rank) + " joined with size/window/chunk " +
                              std::to_string(join.size) + "/" + std::to_string(join.window) + "/" +
                              std::to_string(join.chunk_bytes) + ", its peers with " + std::to_string(s.size) +
                              "/" + std::to_string(s.window) + "/" + std::to_string(s.chunk_bytes);
      fail_job(id, why);
      return send_error_and_close(c, why);
    }
    if (epoch > job.epoch()) {  // the ranks reset the rail (failover re-admission): a fresh job
      fail_job(id, "job " + std::to_string(id) + " restarted at epoch " + std::to_string(epoch));
      it = jobs_.end();
    }
  }
  if (it == jobs_.end()) {
    const size_t need = AggJob::reserved_bytes(join);
    if (reserved_ + need > opt_.pool_bytes)
      return send_error_and_close(c, "daemon pool full: job " + std::to_string(id) + " needs " +
                                         std::to_string(need) + " bytes, " +
                                         std::to_string(opt_.pool_bytes - reserved_) + " free");
    auto entry = std::make_unique<JobEntry>();
    entry->job = std::make_unique<AggJob>(id, epoch, join);
    entry->fd_by_rank.assign(join.size, -1);
    entry->reserved = need;
    reserved_ += need;
    it = jobs_.emplace(id, std::move(entry)).first;
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.jobs;
  }
  JobEntry& e = *it->second;
  const int old = e.fd_by_rank[f.header.rank];
  if (old >= 0 && old != c.fd) {  // a rank reconnected: its old connection is done
    auto oc = conns_.find(old);
    if (oc != conns_.end()) {
      oc->second->state = Conn::State::kClosing;  // detached from the job before it closes
      oc->second->job = 0;
      close_conn(*oc->second, "replaced by a reconnection");
    }
  }
  e.fd_by_rank[f.header.rank] = c.fd;
  if (e.lost_rank == f.header.rank) e.lost_rank = -1;
  e.last_progress = Clock::now();
  c.job = id;
  c.rank = f.header.rank;
  c.state = Conn::State::kJoined;
  c.max_payload_joined = join.chunk_bytes;
  c.fit_buffer();
  queue(c, control_frame(AggType::kJoined, id, ""), false);
}

void AggDaemon::handle_chunk(Conn& c, const AggFrame& f) {
  JobEntry& e = *jobs_.at(c.job);
  if (c.unanswered >= e.job->shape().window)
    throw ProtocolError("rank " + std::to_string(c.rank) + " sent more than " +
                        std::to_string(e.job->shape().window) + " chunks unanswered (window exceeded)");
  AggJob::Contribution r = e.job->contribute(f.header, f.payload);
  e.last_progress = Clock::now();
  switch (r.outcome) {
    case AggJob::Outcome::kStale:
      return;
    case AggJob::Outcome::kPending:
      ++c.unanswered;
      return;
    case AggJob::Outcome::kResend:
      ++c.unanswered;
      return queue(c, r.result, true);
    case AggJob::Outcome::kCompleted:
      ++c.unanswered;
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ++stats_.chunks_reduced;
      }
      for (int fd : e.fd_by_rank) {
        auto it = conns_.find(fd);
        if (it != conns_.end() && !it->second->dead) queue(*it->second, r.result, true);
      }
      return;
  }
}

void AggDaemon::queue(Conn& c, std::shared_ptr<const std::string> frame, bool answers_chunk) {
  c.out.push_back({std::move(frame), 0, answers_chunk});
  on_writable(c);  // most frames fit the socket buffer at once
}

void AggDaemon::on_writable(Conn& c) {
  while (!c.out.empty() && !c.dead) {
    iovec iov[16];
    int n = 0;
    for (auto it = c.out.begin(); it != c.out.end() && n < 16; ++it, ++n) {
      iov[n].iov_base = const_cast<char*>(it->frame->data()) + it->written;
      iov[n].iov_len = it->frame->size() - it->written;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t sent = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return close_conn(c, errno_text(errno));
    }
    size_t left = static_cast<size_t>(sent);
    while (left > 0) {
      Conn::Out& o = c.out.front();
      const size_t take = std::min(left, o.frame->size() - o.written);
      o.written += take;
      left -= take;
      if (o.written == o.frame->size()) {
        if (o.answers_chunk && c.unanswered > 0) --c.unanswered;
        c.out.pop_front();
      }
    }
  }
  if (c.dead) return;
  if (c.out.empty() && c.state == Conn::State::kClosing) return close_conn(c, "");
  update_events(c);
}

void AggDaemon::update_events(Conn& c) {
  const bool want = !c.out.empty();
  if (want == c.writable_armed) return;
  epoll_event ev{};
  ev.events = want ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
  ev.data.fd = c.fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  c.writable_armed = want;
}

void AggDaemon::send_error_and_close(Conn& c, const std::string& why) {
  NZ_LOG(Warning) << "nezha-aggd: closing " << c.peer << ": " << why;
  c.state = Conn::State::kClosing;
  queue(c, error_frame(c.job, why), false);
}

void AggDaemon::fail_job(uint64_t job_id, const std::string& why) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  NZ_LOG(Warning) << "nezha-aggd: job " << job_id << " failed: " << why;
  std::unique_ptr<JobEntry> e = std::move(it->second);
  jobs_.erase(it);
  reserved_ -= e->reserved;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.job_errors;
  }
  auto frame = error_frame(job_id, "job " + std::to_string(job_id) + ": " + why);
  for (int fd : e->fd_by_rank) {
    auto c = conns_.find(fd);
    if (c == conns_.end() || c->second->dead || c->second->job != job_id) continue;
    c->second->state = Conn::State::kClosing;
    c->second->job = 0;
    queue(*c->second, frame, false);
  }
}

void AggDaemon::close_conn(Conn& c, const std::string& why) {
  if (c.dead) return;
  c.dead = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  if (c.state != Conn::State::kJoined) return;
  auto it = jobs_.find(c.job);
  if (it == jobs_.end()) return;
  JobEntry& e = *it->second;
  if (e.fd_by_rank[c.rank] == c.fd) e.fd_by_rank[c.rank] = -1;
  bool anyone = false;
  for (int fd : e.fd_by_rank) anyone = anyone || fd >= 0;
  if (!anyone) {  // every rank has left: the job is over
    reserved_ -= e.reserved;
    jobs_.erase(it);
    return;
  }
  e.lost_rank = static_cast<int>(c.rank);
  e.rank_lost_at = Clock::now();
  NZ_LOG(Debug) << "nezha-aggd: job " << c.job << " rank " << c.rank << " " << why;
}

void AggDaemon::reap_closed() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->second->dead) {
      ::close(it->first);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void AggDaemon::check_timeouts() {
  std::vector<std::pair<uint64_t, std::string>> expired;
  for (auto& [id, e] : jobs_) {
    if (e->lost_rank >= 0 && seconds_since(e->rank_lost_at) > opt_.job_timeout_s)
      expired.push_back({id, "rank " + std::to_string(e->lost_rank) + " disconnected and did not come back within " +
                                 std::to_string(opt_.job_timeout_s) + " s"});
    else if (e->job->open_slots() > 0 && seconds_since(e->last_progress) > opt_.job_timeout_s)
      expired.push_back({id, "no chunk arrived for " + std::to_string(opt_.job_timeout_s) +
                                 " s while chunks were open (a rank is stuck or dead)"});
  }
  for (auto& [id, why] : expired) fail_job(id, why);
  for (auto& [fd, c] : conns_)
    if (!c->dead && c->state != Conn::State::kJoined && seconds_since(c->opened) > opt_.handshake_timeout_s)
      close_conn(*c, "did not join a job in time");
}

}  // namespace nezha::aggd
