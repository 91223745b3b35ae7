#include "transport/shm/shm_pair_handoff.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "transport/shm/shm_handoff.h"
#include "common/logging.h"

namespace nezha::transport::shm {

namespace {

constexpr size_t kRequestBytes = 4 + 16;  // rank (host order: same host) + nonce
constexpr int kIdleWakeMs = 1000;         // the server's poll bound: it re-checks strangers' age
constexpr int kHangupGraceMs = 200;       // a dying peer's socket closes just before its pidfd fires
constexpr size_t kMaxWaiting = 256;       // unfinished requests held at once (abstract names are visible)

std::string errno_text(int err) { return std::strerror(err); }

struct OwnedFd {
  int fd = -1;
  explicit OwnedFd(int f) : fd(f) {}
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  void reset(int f) {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

// Sends `bytes` with one fd attached. Returns false on any error (errno set).
bool send_with_fd(int sock, const void* bytes, size_t n, int fd) {
  iovec iov{const_cast<void*>(bytes), n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof control);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

// Receives up to n bytes and at most one fd (*fd, -1 if none came). Returns recvmsg's result.
ssize_t recv_with_fd(int sock, void* bytes, size_t n, int* fd) {
  *fd = -1;
  iovec iov{bytes, n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t got = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (got < 0) return got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
      std::memcpy(fd, CMSG_DATA(c), sizeof *fd);
  return got;
}

// After the peer's socket hung up or refused us: whether its process is gone (its pidfd fires
// within a short grace), so that the error can say "exited" rather than "closed".
bool peer_exited(int pidfd, const Deadline& deadline) {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, std::min(kHangupGraceMs, deadline.remaining_ms(kHangupGraceMs))) > 0;
}

}  // namespace

SegmentServer::SegmentServer(int listener_fd, int segment_fd, std::map<int, PairPeerId> peers, std::string where,
                             Delivered delivered)
    : listener_fd_(listener_fd),
      segment_fd_(segment_fd),
      peers_(std::move(peers)),
      where_(std::move(where)),
      delivered_(std::move(delivered)) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) throw NezhaError(where_ + ": eventfd for the segment server failed: " + errno_text(errno));
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ::close(stop_fd_);
    throw;
  }
}

SegmentServer::~SegmentServer() {
  const uint64_t one = 1;
  if (::write(stop_fd_, &one, sizeof one) != sizeof one)
    NZ_LOG(Error) << where_ << ": cannot wake the segment server to stop it: " << errno_text(errno);
  thread_.join();
  ::close(stop_fd_);
}

bool SegmentServer::answer(int sock) {
  char req[kRequestBytes];
  int their_fd = -1;
  const ssize_t n = recv_with_fd(sock, req, sizeof req, &their_fd);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  OwnedFd theirs(their_fd);
  if (n <= 0) return true;  // hung up before asking
  int32_t rank = -1;
  if (n == static_cast<ssize_t>(sizeof req)) std::memcpy(&rank, req, 4);
  ucred cred{};
  socklen_t len = sizeof cred;
  const bool have_cred = ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
  const auto it = peers_.find(rank);
  if (n != static_cast<ssize_t>(sizeof req) || theirs.fd < 0 || !have_cred || it == peers_.end() ||
      cred.pid != it->second.pid || std::memcmp(req + 4, it->second.nonce.data(), 16) != 0) {
    NZ_LOG(Warning) << where_ << ": refused a segment request claiming rank " << rank << " from pid " << cred.pid
                    << " (not a local peer's process and nonce, or no segment sent along)";
    return true;
  }
  // Delivered before the reply: once the requester has our segment (and may block on us), its own
  // is ours to ring on abort, and our data thread finds it without a handoff of its own.
  try {
    delivered_(rank, theirs.release());
  } catch (const std::exception& e) {
    NZ_LOG(Warning) << where_ << ": rank " << rank << "'s segment, handed over with its request: " << e.what();
  }
  served_.fetch_add(1);  // before the answer: the requester may read the count once it has it
  const char ok = 1;
  send_with_fd(sock, &ok, 1, segment_fd_);  // a failure: the requester gave up meanwhile
  return true;
}

void SegmentServer::run() {
  struct Waiting {
    int fd;
    Clock::time_point since;
  };
  std::vector<Waiting> waiting;  // accepted, request not complete yet
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{stop_fd_, POLLIN, 0}, {listener_fd_, POLLIN, 0}});
    for (const Waiting& w : waiting) fds.push_back({w.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), kIdleWakeMs) < 0 && errno != EINTR) {
      NZ_LOG(Error) << where_ << ": the segment server's poll failed: " << errno_text(errno);
      ::usleep(10 * 1000);  // never spin on a persistent error
      continue;
    }
    if (fds[0].revents != 0) break;
    std::vector<Waiting> still;
    for (size_t k = 0; k < waiting.size(); ++k) {
      const bool expired = Clock::now() - waiting[k].since > std::chrono::milliseconds(kStrangerGraceMs);
      if ((fds[k + 2].revents != 0 && answer(waiting[k].fd)) || expired) ::close(waiting[k].fd);
      else still.push_back(waiting[k]);
    }
    waiting.swap(still);
    if (fds[1].revents != 0) {
      for (;;) {
        const int s = ::accept4(listener_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0) break;
        // The request is sent right after connect(), so it is usually there already.
        if (answer(s) || waiting.size() >= kMaxWaiting) ::close(s);
        else waiting.push_back({s, Clock::now()});
      }
    }
  }
  for (const Waiting& w : waiting) ::close(w.fd);
}

int fetch_peer_segment(const PairRequest& request, int abort_fd, const std::function<std::string()>& abort_reason,
                       int peer_pidfd, const Deadline& deadline) {
  const std::string& who = request.where;
  const std::string peer = "rank " + std::to_string(request.peer_rank);
  const auto gone = [&](const std::string& how) -> PeerError {
    if (peer_exited(peer_pidfd, deadline))
      return PeerError(request.peer_rank, who + ": " + peer + " (pid " + std::to_string(request.peer_pid) +
                                              ") exited before handing over its segment");
    return PeerError(request.peer_rank, who + ": " + peer + " " + how);
  };
  sockaddr_un addr;
  const socklen_t addr_len = abstract_address(request.peer_socket, &addr);
  char req[kRequestBytes];
  const int32_t me = request.my_rank;
  std::memcpy(req, &me, 4);
  std::memcpy(req + 4, request.my_nonce.data(), 16);

  OwnedFd sock(-1);
  bool asked = false;
  for (;;) {
    if (!asked) {
      sock.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (sock.fd < 0) throw NezhaError(who + ": socket(AF_UNIX) failed: " + errno_text(errno));
      if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) {
        if (!send_with_fd(sock.fd, req, sizeof req, request.my_segment_fd))
          throw gone("hung up on the segment handoff (" + errno_text(errno) + ")");
        asked = true;
      } else if (errno != EAGAIN) {  // EAGAIN: its backlog is full; try again shortly
        throw gone("cannot be reached for its segment (" + errno_text(errno) +
                   "): its shm rail is closed or its process exited");
      }
    }
    pollfd fds[3] = {{asked ? sock.fd : -1, POLLIN, 0}, {abort_fd, POLLIN, 0}, {peer_pidfd, POLLIN, 0}};
    ::poll(fds, 3, asked ? deadline.remaining_ms(1000) : std::min(2, deadline.remaining_ms(2)));
    if (fds[1].revents != 0) {
      const std::string reason = abort_reason();
      if (!reason.empty())
        throw NezhaError(who + ": aborted while waiting for " + peer + "'s segment: " + reason);
    }
    if (fds[2].revents != 0)
      throw PeerError(request.peer_rank, who + ": " + peer + " (pid " + std::to_string(request.peer_pid) +
                                             ") exited before handing over its segment");
    if (asked && fds[0].revents != 0) {
      char byte = 0;
      int fd = -1;
      const ssize_t n = recv_with_fd(sock.fd, &byte, 1, &fd);
      if (n == 1 && fd >= 0) return fd;
      if (fd >= 0) ::close(fd);
      if (!(n < 0 && (errno == EAGAIN || errno == EINTR)))
        throw gone("closed the segment handoff without its segment (its rail closed, or it refused our request: "
                   "see its log)");
    }
    if (deadline.expired())
      throw TimeoutError(request.peer_rank,
                         who + ": timed out waiting for " + peer +
                             " to hand over its segment (its process is frozen or starved, or its rail is not "
                             "connected)");
  }
}

}  // namespace nezha::transport::shm
