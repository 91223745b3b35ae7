#include "transport/tcp/control_inbox.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "transport/frame.h"
#include "transport/tcp/frame_stream.h"

namespace nezha::transport::tcp {
namespace {

// Room offered to each recv(): a few typical negotiation messages; a longer message's frame gets
// room for all of it once its header is in.
constexpr size_t kReadRoomBytes = 16 << 10;
// A buffer grown for a long message is given back once that message is out.
constexpr size_t kKeptBufferBytes = 4 * kReadRoomBytes;

}  // namespace

size_t ControlInbox::read(int fd, int peer, const std::string& rail, std::deque<MessagePath::Message>& out) {
  if (buf_.size() < used_ + kReadRoomBytes) buf_.resize(used_ + kReadRoomBytes);
  const ssize_t r = ::recv(fd, buf_.data() + used_, buf_.size() - used_, MSG_DONTWAIT);
  if (r == 0) throw SocketFailure(0);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    throw SocketFailure(errno);
  }
  used_ += static_cast<size_t>(r);
  const auto* bytes = reinterpret_cast<const uint8_t*>(buf_.data());
  size_t at = 0;
  while (used_ - at >= kFrameHeaderBytes) {
    const FrameHeader h = parse_header(bytes + at, peer, rail);
    check_header(h, FrameType::kControl, received_, kMaxControlPayloadBytes, /*exact=*/false, peer, rail);
    const size_t frame = kFrameHeaderBytes + h.length;
    if (used_ - at < frame) {
      if (buf_.size() - at < frame) {  // make room for the whole frame (its length is checked)
        std::memmove(buf_.data(), buf_.data() + at, used_ - at);
        used_ -= at;
        at = 0;
        buf_.resize(frame);
      }
      break;
    }
    out.push_back({peer, buf_.substr(at + kFrameHeaderBytes, h.length)});
    ++received_;
    at += frame;
  }
  if (at > 0) {
    std::memmove(buf_.data(), buf_.data() + at, used_ - at);
    used_ -= at;
  }
  if (used_ == 0 && buf_.size() > kKeptBufferBytes) std::string().swap(buf_);
  return static_cast<size_t>(r);
}

void ControlInbox::drop_partial() {
  used_ = 0;
  std::string().swap(buf_);
}

void ControlInbox::reset() {
  drop_partial();
  received_ = 0;
}

}  // namespace nezha::transport::tcp
