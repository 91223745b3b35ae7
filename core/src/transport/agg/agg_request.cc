// One allreduce on an aggregation rail: streams chunks to nezha-aggd (at most `window` unanswered)
// and reads each chunk's sum back into the output, making progress from one poll loop.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/agg/agg_protocol.h"
#include "transport/frame.h"
#include "transport/agg/agg_rail.h"
#include "transport/tcp/socket.h"

namespace nezha::transport {

using namespace agg;

class AggRail::Request final : public CollectiveRequest {
 public:
  Request(AggRail& rail, const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
          uint64_t seq, OverwriteHook before_overwrite)
      : rail_(rail),
        before_overwrite_(std::move(before_overwrite)),
        in_(static_cast<const uint8_t*>(input)),
        out_(static_cast<uint8_t*>(output)),
        esize_(dtype_size(dtype)),
        chunk_elems_(rail.config_.chunk_bytes / esize_) {
    head_.type = AggType::kChunk;
    head_.dtype = dtype;
    head_.op = op;
    head_.job = rail.job_;
    head_.seq = seq;
    head_.count = count;
    head_.rank = static_cast<uint16_t>(rail.rank_);
    chunks_ = static_cast<uint32_t>(agg_chunk_count(count, chunk_elems_));
    head_.chunks = chunks_;
  }

  bool test() override {
    progress();
    return received_ == chunks_;
  }

  void wait(const Deadline& deadline) override {
    while (!test()) {
      const short events = static_cast<short>(POLLIN | (can_send() ? POLLOUT : 0));
      bool woken = false;
      const short got = tcp::poll_one(rail_.fd_, events, rail_.wake_fd_, deadline, &woken);
      if (woken || rail_.aborted_) rail_.fail("aborted");
      if (got == 0 && deadline.expired()) {
        rail_.failed_ = true;
        throw TimeoutError(rail_.size_, rail_.who() + ": allreduce " + std::to_string(head_.seq) + " timed out with " +
                                            std::to_string(chunks_ - received_) + " of " +
                                            std::to_string(chunks_) + " chunks unanswered");
      }
    }
  }

 private:
  bool can_send() const { return sent_ < chunks_ && sent_ - received_ < rail_.config_.window; }
  size_t chunk_bytes(uint32_t chunk) const { return agg_chunk_elems(head_.count, chunk_elems_, chunk) * esize_; }
  size_t chunk_offset(uint32_t chunk) const { return size_t{chunk} * chunk_elems_ * esize_; }

  void progress() {
    rail_.check_usable();
    for (bool moved = true; moved;) {
      moved = false;
      while (can_send() && send_some()) moved = true;
      while (received_ < chunks_ && recv_some()) moved = true;
    }
  }

  // Writes what the socket takes of the current chunk frame; true if anything was written.
  bool send_some() {
    const size_t payload = chunk_bytes(sent_);
    if (frame_off_ == 0) {
      head_.chunk = sent_;
      head_.length = static_cast<uint32_t>(payload);
      header_ = encode_agg_header(head_);
    }
    iovec iov[2];
    int n = 0;
    if (frame_off_ < kAggHeaderBytes) iov[n++] = {header_.data() + frame_off_, kAggHeaderBytes - frame_off_};
    const size_t poff = frame_off_ > kAggHeaderBytes ? frame_off_ - kAggHeaderBytes : 0;
    if (payload > poff) iov[n++] = {const_cast<uint8_t*>(in_) + chunk_offset(sent_) + poff, payload - poff};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(rail_.fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      rail_.fail("send failed: " + tcp::errno_text(errno));
    }
    frame_off_ += static_cast<size_t>(w);
    rail_.bytes_sent_ += static_cast<uint64_t>(w);
    if (frame_off_ == kAggHeaderBytes + payload) {
      frame_off_ = 0;
      ++sent_;
    }
    return w > 0;
  }

  // Reads what has arrived of the next result; true if anything was read.
  bool recv_some() {
    ssize_t r;
    if (hdr_got_ < kAggHeaderBytes) {
      r = ::recv(rail_.fd_, hdr_ + hdr_got_, kAggHeaderBytes - hdr_got_, MSG_DONTWAIT);
      if (!check_read(r)) return false;
      hdr_got_ += static_cast<size_t>(r);
      if (hdr_got_ == kAggHeaderBytes) on_header();
      else return true;
    } else {
      const size_t want = chunk_bytes(received_) - pay_got_;
      r = ::recv(rail_.fd_, out_ + chunk_offset(received_) + pay_got_, want, MSG_DONTWAIT);
      if (!check_read(r)) return false;
      pay_got_ += static_cast<size_t>(r);
    }
    if (hdr_got_ == kAggHeaderBytes && pay_got_ == chunk_bytes(received_)) {
      hdr_got_ = pay_got_ = 0;
      ++received_;
    }
    return true;
  }

  bool check_read(ssize_t r) {
    if (r > 0) {
      rail_.bytes_received_ += static_cast<uint64_t>(r);
      return true;
    }
    if (r == 0) rail_.fail("the daemon closed the connection (allreduce " + std::to_string(head_.seq) + ")");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    rail_.fail("recv failed: " + tcp::errno_text(errno));
  }

  void on_header() {
    AggFrame f;
    // The header alone: decode with the payload not yet read (0 = "more needed" is fine here).
    try {
      uint8_t probe[kAggHeaderBytes];
      std::memcpy(probe, hdr_, kAggHeaderBytes);
      decode_agg_frame(probe, kAggHeaderBytes, kMaxAggPayloadBytes, &f);
    } catch (const ProtocolError& e) {
      rail_.fail(e.what());
    }
    const uint32_t length = static_cast<uint32_t>(get_le(hdr_ + 40, 4));
    const uint8_t type = hdr_[5];
    if (type == static_cast<uint8_t>(AggType::kError)) read_error_and_fail(length);
    const uint64_t seq = get_le(hdr_ + 16, 8);
    const uint32_t chunk = static_cast<uint32_t>(get_le(hdr_ + 24, 4));
    if (type != static_cast<uint8_t>(AggType::kResult) || seq != head_.seq || chunk != received_ ||
        length != chunk_bytes(received_))
      rail_.fail("sent " + std::string(agg_type_name(static_cast<AggType>(type))) + " for allreduce " +
                 std::to_string(seq) + " chunk " + std::to_string(chunk) + " (" + std::to_string(length) +
                 " bytes) where the result of allreduce " + std::to_string(head_.seq) + " chunk " +
                 std::to_string(received_) + " was expected");
    // The chunk's payload follows: its input leaves the output now (it was sent before the daemon
    // could answer), so this is where the engine keeps it.
    if (before_overwrite_) before_overwrite_(chunk_offset(received_), chunk_bytes(received_));
  }

  [[noreturn]] void read_error_and_fail(uint32_t length) {
    std::string text(std::min<size_t>(length, kMaxAggErrorBytes), '\0');
    size_t got = 0;
    const Deadline d = Deadline::after_seconds(1);
    while (got < text.size() && !d.expired()) {
      const ssize_t r = ::recv(rail_.fd_, text.data() + got, text.size() - got, MSG_DONTWAIT);
      if (r > 0) got += static_cast<size_t>(r);
      else if (r == 0 || (errno != EAGAIN && errno != EINTR)) break;
      else {
        bool woken = false;
        tcp::poll_one(rail_.fd_, POLLIN, -1, d, &woken);
      }
    }
    text.resize(got);
    rail_.fail("the daemon failed the job: " + text);
  }

  AggRail& rail_;
  OverwriteHook before_overwrite_;
  const uint8_t* in_;
  uint8_t* out_;
  size_t esize_;
  uint64_t chunk_elems_;
  AggHeader head_;
  uint32_t chunks_ = 0, sent_ = 0, received_ = 0;
  std::string header_;
  size_t frame_off_ = 0;
  uint8_t hdr_[kAggHeaderBytes];
  size_t hdr_got_ = 0, pay_got_ = 0;
};

std::unique_ptr<CollectiveRequest> AggRail::start_allreduce(const void* input, void* output, size_t count,
                                                             DataType dtype, ReduceOp op, uint64_t seq,
                                                             OverwriteHook before_overwrite) {
  if (!reduces(dtype, op))
    throw InvalidArgument(who() + " does not reduce " + dtype_name(dtype) + " with " + reduce_op_name(op));
  check_usable();
  auto req = std::make_unique<Request>(*this, input, output, count, dtype, op, seq, std::move(before_overwrite));
  req->test();  // start sending at once
  return req;
}

}  // namespace nezha::transport
