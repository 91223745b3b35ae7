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

int unix_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NezhaError("shm: socket(AF_UNIX) failed: " + errno_text(errno));
  return fd;
}

struct Client {  // our request to one peer
  int fd = -1;
  bool done = false;
  std::vector<int> fds;  // received
  std::string last_error;
};

// Reads the peer's reply (one byte + SCM_RIGHTS fds). Returns the fds (exactly `expected` of them),
// or nothing if the reply is not there yet.
std::vector<int> receive_fds(int sock, size_t expected, const std::string& who) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxHandoffFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return {};
  if (n <= 0) throw PeerError(-1, who + ": closed the segment handoff without a segment");
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  if (fds.size() != expected || (msg.msg_flags & MSG_CTRUNC)) {
    for (int fd : fds) ::close(fd);
    throw ProtocolError(who + ": segment handoff reply carried " + std::to_string(fds.size()) + " fds, expected " +
                        std::to_string(expected));
  }
  return fds;
}

// Answers one accepted connection if its request is complete and genuine. Returns the rank served,
// -1 if the request is not complete yet, -2 if it was refused (logged; the connection is dropped).
int serve(int sock, const std::map<int, const HandoffPeer*>& by_rank, const std::vector<int>& served_fds,
          const std::string& rail_name) {
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
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxHandoffFds)];
  std::memset(control, 0, sizeof control);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * served_fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * served_fds.size());
  std::memcpy(CMSG_DATA(c), served_fds.data(), sizeof(int) * served_fds.size());
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != 1) return -2;
  return rank;
}

}  // namespace

socklen_t abstract_address(const std::string& name, sockaddr_un* out) {
  std::memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof out->sun_path) throw InvalidArgument("shm: socket name too long");
  std::memcpy(out->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

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
  std::vector<std::vector<int>> got = exchange_fds(listener, my_rank, my_nonce, {segment_fd}, peers, aborted,
                                                   deadline, rail_name);
  std::vector<int> out;
  for (auto& fds : got) out.push_back(fds[0]);
  return out;
}

std::vector<std::vector<int>> exchange_fds(const HandoffListener& listener, int my_rank, const std::string& my_nonce,
                                           const std::vector<int>& served_fds, const std::vector<HandoffPeer>& peers,
                                           const std::atomic<bool>& aborted, const Deadline& deadline,
                                           const std::string& rail_name) {
  if (served_fds.empty() || served_fds.size() > kMaxHandoffFds)
    throw InvalidArgument("shm handoff: serves 1 to " + std::to_string(kMaxHandoffFds) + " fds, not " +
                          std::to_string(served_fds.size()));
  const std::string where = "rail " + rail_name + ", rank " + std::to_string(my_rank);
  std::map<int, const HandoffPeer*> by_rank;
  for (const auto& p : peers) by_rank[p.rank] = &p;
  std::vector<Client> clients(peers.size());
  std::map<int, bool> served;  // rank -> answered
  std::vector<int> accepted;   // connections whose request has not arrived yet
  auto cleanup = [&] {
    for (auto& c : clients) {
      if (c.fd >= 0) ::close(c.fd);
      for (int fd : c.fds) ::close(fd);
    }
    for (int fd : accepted) ::close(fd);
  };
  // Each pass touches only what poll() reported ready (and requests not yet sent): a pass over
  // every pending peer per wake-up costs a rank O(n^2) system calls on a host of n ranks.
  std::vector<char> client_ready(peers.size(), 1), accepted_ready;
  bool listener_ready = true;
  std::vector<pollfd> fds;
  std::vector<long> fd_owner;  // per fds entry: client i (>= 0), accepted k (-2 - k), listener (-1)
  try {
    for (;;) {
      if (aborted.load()) throw NezhaError(where + ": aborted while connecting");
      for (size_t i = 0; i < peers.size(); ++i) {
        Client& c = clients[i];
        if (c.done) continue;
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
          client_ready[i] = 1;
        }
        if (!client_ready[i]) continue;
        client_ready[i] = 0;
        c.fds = receive_fds(c.fd, served_fds.size(), where + ": rank " + std::to_string(peers[i].rank));
        if (!c.fds.empty()) {
          c.done = true;
          ::close(c.fd);
          c.fd = -1;
        }
      }
      // Accept and answer whatever is waiting.
      for (; listener_ready;) {
        const int s = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0) break;
        accepted.push_back(s);
        accepted_ready.push_back(1);
      }
      listener_ready = false;
      for (size_t i = 0; i < accepted.size();) {
        if (!accepted_ready[i]) {
          ++i;
          continue;
        }
        const int r = serve(accepted[i], by_rank, served_fds, rail_name);
        if (r == -1) {
          accepted_ready[i] = 0;
          ++i;
          continue;
        }
        if (r >= 0) served[r] = true;
        ::close(accepted[i]);
        accepted.erase(accepted.begin() + static_cast<long>(i));
        accepted_ready.erase(accepted_ready.begin() + static_cast<long>(i));
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
      fds.assign({{listener.fd(), POLLIN, 0}});
      fd_owner.assign({-1});
      for (size_t i = 0; i < clients.size(); ++i)
        if (clients[i].fd >= 0 && !clients[i].done) {
          fds.push_back({clients[i].fd, POLLIN, 0});
          fd_owner.push_back(static_cast<long>(i));
        }
      for (size_t k = 0; k < accepted.size(); ++k) {
        fds.push_back({accepted[k], POLLIN, 0});
        fd_owner.push_back(-2 - static_cast<long>(k));
      }
      ::poll(fds.data(), fds.size(), deadline.remaining_ms(20));
      for (size_t j = 0; j < fds.size(); ++j) {
        if (fds[j].revents == 0) continue;
        const long owner = fd_owner[j];
        if (owner == -1) listener_ready = true;
        else if (owner >= 0) client_ready[static_cast<size_t>(owner)] = 1;
        else accepted_ready[static_cast<size_t>(-2 - owner)] = 1;
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  std::vector<std::vector<int>> out;
  for (auto& c : clients) out.push_back(std::move(c.fds));
  cleanup();
  return out;
}

}  // namespace nezha::transport::shm
