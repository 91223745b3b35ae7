#include "transport/agg/agg_rail.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <openssl/rand.h>

#include "common/error.h"
#include "transport/agg/agg_protocol.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/tcp/socket.h"

namespace nezha::transport {

using namespace agg;

AggRail::AggRail(AggRailConfig config, int rank, int size)
    : config_(std::move(config)), rank_(rank), size_(size) {
  if (size < 1 || static_cast<uint32_t>(size) > kMaxAggRanks)
    throw InvalidArgument("rail '" + config_.name + "': nezha-aggd serves jobs of 1 to " +
                          std::to_string(kMaxAggRanks) + " ranks, not " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw InvalidArgument("rail '" + config_.name + "': rank " + std::to_string(rank) + " out of range for " +
                          std::to_string(size) + " ranks");
  tcp::parse_ipv4_endpoint(config_.daemon);  // InvalidArgument for anything but ADDR:PORT
  if (config_.chunk_bytes < kMinAggChunkBytes || config_.chunk_bytes > kMaxAggChunkBytes ||
      config_.chunk_bytes % 64 || config_.window < 1 || config_.window > kMaxAggWindow)
    throw InvalidArgument("rail '" + config_.name + "': chunk_bytes must be a multiple of 64 in [4096, 4 MiB] "
                          "and window in [1, 64]");
  properties_.name = config_.name;
  properties_.kind = "agg";
  properties_.local_addr = "agg:" + config_.daemon;
  properties_.latency_us_prior = 100;  // two hops through a software daemon
  // A collective rail at link speed L moves a share of N bytes in N / L: its prior is the link itself
  // (a ring's would be L / (2(n-1)/n)).
  properties_.gbps_prior = config_.gbps_prior;
  nonce_.assign(8, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce_.data()), 8) != 1)
    throw NezhaError("rail '" + config_.name + "': RAND_bytes failed");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw NezhaError("rail '" + config_.name + "': eventfd failed");
}

AggRail::~AggRail() {
  close();
  ::close(wake_fd_);
}

std::string AggRail::who() const { return "rail '" + config_.name + "' (nezha-aggd at " + config_.daemon + ")"; }

RailCounters AggRail::counters() const { return {bytes_sent_.load(), bytes_received_.load()}; }

void AggRail::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  aborted_ = true;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void AggRail::check_usable() const {
  if (aborted_) {
    std::lock_guard<std::mutex> lock(reason_mu_);
    throw NezhaError(who() + " aborted: " + abort_reason_);
  }
  if (failed_ || fd_ < 0) throw PeerError(size_, who() + " is not connected (failed earlier; awaiting re-admission)");
}

void AggRail::fail(const std::string& what) {
  failed_ = true;
  close();
  if (aborted_) {
    std::lock_guard<std::mutex> lock(reason_mu_);
    throw NezhaError(who() + " aborted: " + abort_reason_);
  }
  throw PeerError(size_, who() + ": " + what);
}

void AggRail::reset() {
  close();
  failed_ = false;
  aborted_ = false;
  uint64_t drain;
  while (::read(wake_fd_, &drain, sizeof drain) > 0) {}
  std::lock_guard<std::mutex> lock(reason_mu_);
  abort_reason_.clear();
}

void AggRail::close() {
  watched_fd_.store(-1, std::memory_order_release);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string AggRail::link_fault() const {
  std::lock_guard<std::mutex> lock(link_mu_);
  return link_ ? link_->fault() : std::string();
}

bool AggRail::delivering(std::chrono::milliseconds quiet) const {
  // The fd may be closed (and its number reused) while this reads: a stale answer only delays a report.
  return tcp::acknowledges(watched_fd_.load(std::memory_order_acquire), quiet).value_or(false);
}

bool AggRail::reduces(DataType dtype, ReduceOp op) const {
  // The daemon reduces every dtype x op the ring does (the same kernels, in rank order).
  return is_valid_dtype(static_cast<int>(dtype)) && is_valid_reduce_op(static_cast<int>(op));
}

void AggRail::send_frame(const std::string& frame, const Deadline& deadline) {
  size_t off = 0;
  while (off < frame.size()) {
    const ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) fail("send failed: " + tcp::errno_text(errno));
    bool woken = false;
    if (tcp::poll_one(fd_, POLLOUT, wake_fd_, deadline, &woken) == 0) {
      if (woken || aborted_) fail("aborted");
      if (deadline.expired()) { failed_ = true; throw TimeoutError(size_, who() + ": timed out in the handshake"); }
    }
  }
}

std::string AggRail::recv_frame(uint32_t expected_type, const Deadline& deadline) {
  std::string buf;
  for (;;) {
    AggFrame f;
    size_t used = 0;
    try {
      used = decode_agg_frame(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), kMaxAggErrorBytes, &f);
    } catch (const ProtocolError& e) {
      fail(e.what());
    }
    if (used) {
      std::string payload(reinterpret_cast<const char*>(f.payload), f.header.length);
      if (f.header.type == AggType::kError) fail("refused: " + payload);
      if (static_cast<uint32_t>(f.header.type) != expected_type)
        fail(std::string("sent a ") + agg_type_name(f.header.type) + " frame during the handshake");
      return payload;
    }
    char tmp[1024];
    const size_t want = std::min(sizeof tmp, kAggHeaderBytes + kMaxAggErrorBytes - buf.size());
    const ssize_t n = ::recv(fd_, tmp, want, 0);
    if (n > 0) {
      buf.append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) fail("closed the connection during the handshake");
    if (errno != EAGAIN && errno != EINTR) fail("recv failed: " + tcp::errno_text(errno));
    bool woken = false;
    if (tcp::poll_one(fd_, POLLIN, wake_fd_, deadline, &woken) == 0) {
      if (woken || aborted_) fail("aborted");
      if (deadline.expired()) { failed_ = true; throw TimeoutError(size_, who() + ": timed out in the handshake"); }
    }
  }
}

void AggRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (addresses_by_rank.size() != static_cast<size_t>(size_) || addresses_by_rank[0].size() != 8)
    throw InvalidArgument(who() + ": connect needs every rank's address (rank 0's names the job)");
  close();
  failed_ = false;
  job_ = get_le(reinterpret_cast<const uint8_t*>(addresses_by_rank[0].data()), 8);
  ++epoch_;
  Deadline hs = Deadline::after_seconds(config_.handshake_timeout_s);
  const Deadline& d = hs.at() < deadline.at() ? hs : deadline;
  tcp::Fd fd = tcp::open_stream_socket(false);
  tcp::tune_socket(fd.get(), size_t{4} << 20);
  const int err = tcp::connect_with_deadline(fd.get(), tcp::parse_ipv4_endpoint(config_.daemon), wake_fd_, d);
  if (err != 0) {
    failed_ = true;
    throw PeerError(size_, who() + ": cannot connect: " + tcp::errno_text(err));
  }
  fd_ = fd.release();
  ConnectorHandshake hsk(HandshakeParams{config_.secret, rank_, size_, kAggRailIndex}, size_);
  AggHeader h;
  h.job = job_;
  h.rank = static_cast<uint16_t>(rank_);
  auto frame = [&](AggType t, const std::string& payload) {
    h.type = t;
    return encode_agg_frame(h, payload.data(), payload.size());
  };
  send_frame(frame(AggType::kHello, hsk.hello()), d);
  const std::string challenge = recv_frame(static_cast<uint32_t>(AggType::kChallenge), d);
  std::string response;
  try {
    response = hsk.on_challenge(challenge);
  } catch (const AuthenticationError& e) {
    try { send_frame(frame(AggType::kAuthResult, auth_result_payload(false)), d); } catch (...) {}
    fail(std::string("authentication failed: the daemon does not hold our key (") + e.what() + ")");
  }
  send_frame(frame(AggType::kAuthResponse, response), d);
  try {
    hsk.on_result(recv_frame(static_cast<uint32_t>(AggType::kAuthResult), d));
  } catch (const AuthenticationError&) {
    fail("the daemon rejected our key (NEZHA_AGG_SECRET / secret_file differ)");
  }
  h.seq = epoch_;
  send_frame(frame(AggType::kJoin, encode_join_payload({static_cast<uint32_t>(size_), config_.window,
                                                         config_.chunk_bytes})), d);
  recv_frame(static_cast<uint32_t>(AggType::kJoined), d);
  watched_fd_.store(fd_, std::memory_order_release);
  const std::string local = tcp::local_endpoint(fd_);
  const std::string local_ip = local.substr(0, local.rfind(':'));
  std::lock_guard<std::mutex> lock(link_mu_);
  if (!link_ || link_->ipv4() != local_ip) link_ = std::make_unique<tcp::LinkState>(local_ip);
}

}  // namespace nezha::transport
