// Small POSIX socket helpers for the TCP rail: an owning fd, IPv4 endpoints, socket options,
// a deadline-bounded non-blocking connect and a poll() wrapper. Nothing here knows about ranks or
// frames; errors carry errno text and the address involved.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <optional>
#include <string>

#include "common/deadline.h"

namespace nezha::transport::tcp {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "a.b.c.d:port" <-> sockaddr_in. Throws InvalidArgument on anything but a numeric IPv4 endpoint.
sockaddr_in parse_ipv4_endpoint(const std::string& endpoint);
sockaddr_in ipv4_address(const std::string& ip, uint16_t port);  // ip without port
std::string format_endpoint(const sockaddr_in& addr);
std::string local_endpoint(int fd);   // getsockname, "?" on failure
std::string remote_endpoint(int fd);  // getpeername, "?" on failure

// A non-blocking, close-on-exec stream socket (TCP, or MPTCP when mptcp is true). Throws NezhaError
// with a clear reason when the kernel does not offer MPTCP.
Fd open_stream_socket(bool mptcp);
void set_nonblocking(int fd);
// TCP_NODELAY (best effort on MPTCP) and SO_SNDBUF/SO_RCVBUF; set before connect/listen so the
// window scale is negotiated for the requested size.
void tune_socket(int fd, size_t buffer_bytes);

// Connects `fd` (already bound to its source address) to `to`. Returns 0 on success or the errno
// of the failure (ECONNREFUSED, ETIMEDOUT when the deadline passed, ECANCELED when wake_fd fired).
int connect_with_deadline(int fd, const sockaddr_in& to, int wake_fd, const Deadline& deadline);

// poll() on fd for `events` plus wake_fd (may be -1) for POLLIN, bounded by the deadline and
// retried on EINTR. Returns the revents of fd (0 when the deadline passed); sets *woken when
// wake_fd is readable.
short poll_one(int fd, short events, int wake_fd, const Deadline& deadline, bool* woken);

// Whether a connected TCP socket still delivers (TCP_INFO): false when data sent on it has gone
// unacknowledged for `quiet` (a path that drops packets: a cut beyond this host's own link); true
// when everything sent was acknowledged (the peer may be slow to read: its window fills, which is a
// late peer, not a broken path); nullopt when the kernel gives no TCP_INFO (closed fd, not TCP).
std::optional<bool> acknowledges(int fd, std::chrono::milliseconds quiet);

std::string errno_text(int err);

}  // namespace nezha::transport::tcp
