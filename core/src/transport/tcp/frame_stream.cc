#include "transport/tcp/frame_stream.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

#include "common/error.h"
#include "transport/tcp/socket.h"

namespace nezha::transport::tcp {
namespace {

bool transient(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

SocketFailure::SocketFailure(int error)
    : std::runtime_error(error == 0 ? std::string("connection closed by peer") : errno_text(error)),
      err(error) {}

FrameSender::FrameSender(FrameType type, uint64_t tag, const void* payload, size_t bytes)
    : header_(encode_header(type, tag, bytes)),
      payload_(static_cast<const uint8_t*>(payload)),
      bytes_(bytes) {}

size_t FrameSender::progress(int fd) {
  size_t payload_written = 0;
  while (!done()) {
    iovec iov[2];
    int n = 0;
    if (sent_ < kFrameHeaderBytes) {
      iov[n++] = {header_.data() + sent_, kFrameHeaderBytes - sent_};
      if (bytes_ > 0) iov[n++] = {const_cast<uint8_t*>(payload_), bytes_};
    } else {
      const size_t off = sent_ - kFrameHeaderBytes;
      iov[n++] = {const_cast<uint8_t*>(payload_) + off, bytes_ - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    // MSG_NOSIGNAL: a peer that went away must become a PeerError, not a SIGPIPE.
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (transient(errno)) break;
      throw SocketFailure(errno);
    }
    const size_t header_before = sent_ < kFrameHeaderBytes ? kFrameHeaderBytes - sent_ : 0;
    payload_written += static_cast<size_t>(w) > header_before ? static_cast<size_t>(w) - header_before : 0;
    size_t wanted = 0;
    for (int i = 0; i < n; ++i) wanted += iov[i].iov_len;
    sent_ += static_cast<size_t>(w);
    // A short write means the send buffer is full: skip the sendmsg that would only say EAGAIN.
    if (static_cast<size_t>(w) < wanted) break;
  }
  return payload_written;
}

size_t FrameReceiver::progress(int fd, const HeaderHandler& on_header) {
  size_t payload_read = 0;
  while (header_got_ < kFrameHeaderBytes) {
    const ssize_t r = ::recv(fd, header_ + header_got_, kFrameHeaderBytes - header_got_, MSG_DONTWAIT);
    if (r == 0) throw SocketFailure(0);
    if (r < 0) {
      if (transient(errno)) return 0;
      throw SocketFailure(errno);
    }
    header_got_ += static_cast<size_t>(r);
    if (header_got_ == kFrameHeaderBytes) payload_ = on_header(header_, &length_);
  }
  while (payload_got_ < length_) {
    const uint64_t wanted = length_ - payload_got_;
    const ssize_t r = ::recv(fd, payload_ + payload_got_, wanted, MSG_DONTWAIT);
    if (r == 0) throw SocketFailure(0);
    if (r < 0) {
      if (transient(errno)) break;
      throw SocketFailure(errno);
    }
    payload_got_ += static_cast<uint64_t>(r);
    payload_read += static_cast<size_t>(r);
    // A short read means the socket is drained for now; return to poll() instead of spinning on
    // recv for as long as a fast sender keeps data coming (bounds the time one call takes).
    if (static_cast<uint64_t>(r) < wanted) break;
  }
  return payload_read;
}

void FrameReceiver::reset() { *this = FrameReceiver(); }

namespace {

void wait_for(int fd, short events, int wake_fd, const Deadline& deadline) {
  bool woken = false;
  const short revents = poll_one(fd, events, wake_fd, deadline, &woken);
  if (woken) throw SocketFailure(ECANCELED);
  if (revents == 0) throw SocketFailure(ETIMEDOUT);
}

}  // namespace

void write_frame(int fd, FrameType type, const std::string& payload, int wake_fd,
                 const Deadline& deadline) {
  FrameSender sender(type, 0, payload.data(), payload.size());
  for (sender.progress(fd); !sender.done(); sender.progress(fd)) wait_for(fd, POLLOUT, wake_fd, deadline);
}

FrameHeader read_frame(int fd, uint64_t max_length, std::string* payload, int wake_fd,
                       const Deadline& deadline) {
  FrameHeader header;
  FrameReceiver receiver;
  auto on_header = [&](const uint8_t* bytes, uint64_t* length) -> uint8_t* {
    header = parse_header(bytes);
    if (header.length > max_length)
      throw ProtocolError("frame of " + std::to_string(header.length) + " bytes where at most " +
                          std::to_string(max_length) + " were expected");
    payload->assign(header.length, '\0');
    *length = header.length;
    return reinterpret_cast<uint8_t*>(payload->data());
  };
  for (receiver.progress(fd, on_header); !receiver.done(); receiver.progress(fd, on_header))
    wait_for(fd, POLLIN, wake_fd, deadline);
  return header;
}

}  // namespace nezha::transport::tcp
