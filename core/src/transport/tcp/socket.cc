#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

namespace nezha::transport::tcp {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_text(int err) { return std::strerror(err); }

std::optional<bool> acknowledges(int fd, std::chrono::milliseconds quiet) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (fd < 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  return !(info.tcpi_unacked > 0 && info.tcpi_last_ack_recv >= static_cast<uint32_t>(quiet.count()));
}

sockaddr_in ipv4_address(const std::string& ip, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1)
    throw InvalidArgument("'" + ip + "' is not a numeric IPv4 address");
  return addr;
}

sockaddr_in parse_ipv4_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size())
    throw InvalidArgument("'" + endpoint + "' is not an ip:port endpoint");
  const std::string port_text = endpoint.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    throw InvalidArgument("'" + endpoint + "' has an invalid port");
  return ipv4_address(endpoint.substr(0, colon), static_cast<uint16_t>(port));
}

std::string format_endpoint(const sockaddr_in& addr) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(addr.sin_port));
}

std::string local_endpoint(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return format_endpoint(addr);
}

std::string remote_endpoint(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return format_endpoint(addr);
}

Fd open_stream_socket(bool mptcp) {
  const int protocol = mptcp ? IPPROTO_MPTCP : IPPROTO_TCP;
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol));
  if (!fd.valid()) {
    const int err = errno;
    if (mptcp)
      throw NezhaError("MPTCP requested but socket(IPPROTO_MPTCP) failed: " + errno_text(err) +
                       " (needs Linux >= 5.6 with net.mptcp.enabled=1)");
    throw NezhaError("socket(AF_INET, SOCK_STREAM) failed: " + errno_text(err));
  }
  return fd;
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw NezhaError("fcntl(O_NONBLOCK) failed: " + errno_text(errno));
}

void tune_socket(int fd, size_t buffer_bytes) {
  int one = 1;
  // Frames are written whole by writev; Nagle would only add latency to the small ones.
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    NZ_LOG(Debug) << "TCP_NODELAY not supported on this socket: " << errno_text(errno);
  }
  if (buffer_bytes > 0) {
    int bytes = static_cast<int>(buffer_bytes);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes) != 0) {
      NZ_LOG(Warning) << "could not set socket buffers to " << buffer_bytes
                      << " bytes: " << errno_text(errno);
    }
  }
}

short poll_one(int fd, short events, int wake_fd, const Deadline& deadline, bool* woken) {
  *woken = false;
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, deadline.remaining_ms());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw NezhaError("poll() failed: " + errno_text(errno));
    }
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) {
      *woken = true;
      return fds[0].revents;
    }
    if (fds[0].revents != 0) return fds[0].revents;
    if (deadline.expired()) return 0;
  }
}

int connect_with_deadline(int fd, const sockaddr_in& to, int wake_fd, const Deadline& deadline) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return 0;
  if (errno != EINPROGRESS && errno != EINTR) return errno;
  bool woken = false;
  const short revents = poll_one(fd, POLLOUT, wake_fd, deadline, &woken);
  if (woken) return ECANCELED;
  if (revents == 0) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

}  // namespace nezha::transport::tcp
