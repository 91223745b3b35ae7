#include "transport/shm/shm_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>

#include "common/error.h"
#include "common/logging.h"

namespace nezha::transport::shm {

namespace {

constexpr size_t kRequestBytes = 4 + 16;  // rank (host order: same host) + nonce

std::string errno_text(int err) { return std::strerror(err); }

socklen_t abstract_address(const std::string& name, sockaddr_un* out) {
  std::memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof out->sun_path) throw InvalidArgument("shm: socket name too long");
  std::memcpy(out->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

int unix_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NezhaError("shm: socket(AF_UNIX) failed: " + errno_text(errno));
  return fd;
}

struct Client {  // our request to one peer
  int fd = -1;
  bool done = false;
  int segment_fd = -1;
  std::string last_error;
};

// Reads the peer's reply (one byte + SCM_RIGHTS fd). Returns the fd, -1 if not there yet.
int receive_fd(int sock, const std::string& who) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
  if (n <= 0) throw PeerError(-1, who + ": closed the segment handoff without a segment");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
      return fd;
    }
  }
  throw ProtocolError(who + ": segment handoff reply carried no fd");
}

// Answers one accepted connection if its request is complete and genuine. Returns the rank served,
// -1 if the request is not complete yet, -2 if it was refused (logged; the connection is dropped).
int serve(int sock, const std::map<int, const HandoffPeer*>& by_rank, const std::string& nonce_unused,
          int segment_fd, const std::string& rail_name) {
  char req[kRequestBytes];
  const ssize_t n = ::recv(sock, req, sizeof req, MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
  if (n >= 0 && n < static_cast<ssize_t>(sizeof req) && n != 0) return -1;
  if (n <= 0) return -2;
  ::recv(sock, req, sizeof req, 0);
  int32_t rank = 0;
  std::memcpy(&rank, req, 4);
  ucred cred{};
  socklen_t len = sizeof cred;
  const auto it = by_rank.find(rank);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || it == by_rank.end() ||
      cred.pid != it->second->address.pid || std::memcmp(req + 4, it->second->nonce.data(), 16) != 0) {
    NZ_LOG(Warning) << "rail " << rail_name << ": refused a segment request claiming rank " << rank
                    << " from pid " << cred.pid << " (not that rank's process or nonce)";
    return -2;
  }
  char byte = 1;
  iovec iov{&byte, 1};
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
  std::memcpy(CMSG_DATA(c), &segment_fd, sizeof segment_fd);
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != 1) return -2;
  return rank;
}

}  // namespace

HandoffListener::HandoffListener(const std::string& socket_name) {
  fd_ = unix_socket();
  sockaddr_un addr;
  const socklen_t len = abstract_address(socket_name, &addr);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, SOMAXCONN) != 0) {
    const int err = errno;
    close();
    throw NezhaError("shm: cannot listen on abstract socket " + socket_name + ": " + errno_text(err));
  }
}

HandoffListener& HandoffListener::operator=(HandoffListener&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void HandoffListener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::vector<int> exchange_segment_fds(const HandoffListener& listener, int my_rank,
                                      const std::string& my_nonce, int segment_fd,
                                      const std::vector<HandoffPeer>& peers,
                                      const std::atomic<bool>& aborted, const Deadline& deadline,
                                      const std::string& rail_name) {
  const std::string where = "rail " + rail_name + ", rank " + std::to_string(my_rank);
  std::map<int, const HandoffPeer*> by_rank;
  for (const auto& p : peers) by_rank[p.rank] = &p;
  std::vector<Client> clients(peers.size());
  std::map<int, bool> served;  // rank -> answered
  std::vector<int> accepted;   // connections whose request has not arrived yet
  auto cleanup = [&] {
    for (auto& c : clients) {
      if (c.fd >= 0) ::close(c.fd);
      if (c.segment_fd >= 0) ::close(c.segment_fd);
    }
    for (int fd : accepted) ::close(fd);
  };
  try {
    for (;;) {
      if (aborted.load()) throw NezhaError(where + ": aborted while connecting");
      bool all = served.size() == peers.size();
      for (size_t i = 0; i < peers.size(); ++i) {
        Client& c = clients[i];
        const std::string who = where + ": rank " + std::to_string(peers[i].rank);
        if (c.done) continue;
        all = false;
        if (c.fd < 0) {  // (re)connect and send the request
          c.fd = unix_socket();
          sockaddr_un addr;
          const socklen_t len = abstract_address(peers[i].address.socket_name, &addr);
          if (::connect(c.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS) {
            c.last_error = errno_text(errno);
            ::close(c.fd);
            c.fd = -1;
            continue;
          }
          char req[kRequestBytes];
          const int32_t r = my_rank;
          std::memcpy(req, &r, 4);
          std::memcpy(req + 4, my_nonce.data(), 16);
          if (::send(c.fd, req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) {
            c.last_error = errno_text(errno);
            ::close(c.fd);
            c.fd = -1;
            continue;
          }
        }
        const int fd = receive_fd(c.fd, who);
        if (fd >= 0) {
          c.segment_fd = fd;
          c.done = true;
          ::close(c.fd);
          c.fd = -1;
        }
      }
      if (all) break;
      // Accept and answer whatever is waiting.
      for (;;) {
        const int s = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0) break;
        accepted.push_back(s);
      }
      for (size_t i = 0; i < accepted.size();) {
        const int r = serve(accepted[i], by_rank, my_nonce, segment_fd, rail_name);
        if (r == -1) {
          ++i;
          continue;
        }
        if (r >= 0) served[r] = true;
        ::close(accepted[i]);
        accepted.erase(accepted.begin() + static_cast<long>(i));
      }
      if (served.size() == peers.size()) {
        bool fetched = true;
        for (auto& c : clients) fetched = fetched && c.done;
        if (fetched) break;
      }
      if (deadline.expired()) {
        std::string missing;
        for (size_t i = 0; i < peers.size(); ++i) {
          if (!clients[i].done)
            missing += " rank " + std::to_string(peers[i].rank) + " (its segment not received" +
                       (clients[i].last_error.empty() ? "" : ": " + clients[i].last_error) + ")";
          else if (!served.count(peers[i].rank))
            missing += " rank " + std::to_string(peers[i].rank) + " (never asked for our segment)";
        }
        throw NezhaError(where + ": shm connect timed out waiting for" + missing);
      }
      std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
      for (auto& c : clients)
        if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
      for (int fd : accepted) fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), deadline.remaining_ms(20));
    }
  } catch (...) {
    cleanup();
    throw;
  }
  std::vector<int> out;
  for (auto& c : clients) {
    out.push_back(c.segment_fd);
    c.segment_fd = -1;
  }
  cleanup();
  return out;
}

}  // namespace nezha::transport::shm
