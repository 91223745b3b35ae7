#include "transport/tcp/acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <list>
#include <vector>

#include "common/logging.h"
#include "common/thread_name.h"
#include "transport/tcp/frame_stream.h"

namespace nezha::transport::tcp {
namespace {

// Caps the number of simultaneous half-done handshakes so a connection flood cannot exhaust fds.
constexpr size_t kMaxPendingHandshakes = 128;

}  // namespace

struct Acceptor::Pending {
  Pending(Fd fd_in, std::string remote_in, AcceptorHandshake handshake_in, Deadline deadline_in)
      : fd(std::move(fd_in)),
        remote(std::move(remote_in)),
        handshake(std::move(handshake_in)),
        deadline(deadline_in) {}

  Fd fd;
  std::string remote;
  AcceptorHandshake handshake;
  Deadline deadline;
  bool hello_done = false;  // false: waiting for kHello; true: waiting for kAuthResponse
  FrameReceiver receiver;
  FrameHeader header;
  std::string payload;
};

Acceptor::Acceptor(Fd listener, HandshakeParams params, std::string rail_name,
                   double handshake_timeout_s, size_t socket_buffer_bytes, AdmitFn admit)
    : listener_(std::move(listener)),
      stop_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      params_(std::move(params)),
      rail_name_(std::move(rail_name)),
      handshake_timeout_s_(handshake_timeout_s),
      socket_buffer_bytes_(socket_buffer_bytes),
      admit_(std::move(admit)) {
  if (!stop_fd_.valid()) throw NezhaError("rail " + rail_name_ + ": eventfd() failed: " + errno_text(errno));
  thread_ = std::thread([this] { loop(); });
}

Acceptor::~Acceptor() { stop(); }

void Acceptor::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (::write(stop_fd_.get(), &one, sizeof one) < 0) {
      // An eventfd write only fails on counter overflow; the thread is already being woken.
    }
    thread_.join();
  }
  listener_.reset();
}

void Acceptor::loop() {
  name_this_thread("nz-accept");
  // A list, not a vector: a half-read frame points into its Pending's payload, so entries must
  // never move.
  std::list<Pending> pending;
  for (;;) {
    std::vector<pollfd> fds = {{stop_fd_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    Deadline next = Deadline::after_seconds(1.0);
    for (const Pending& p : pending) {
      fds.push_back({p.fd.get(), POLLIN, 0});
      if (p.deadline.at() < next.at()) next = p.deadline;
    }
    const int n = ::poll(fds.data(), fds.size(), next.remaining_ms());
    if (n < 0 && errno != EINTR) {
      NZ_LOG(Error) << "rail " << rail_name_ << ": accept loop poll() failed: " << errno_text(errno);
      return;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) return;  // stop(); pending connections close with `pending`

    size_t i = 2;
    for (auto it = pending.begin(); it != pending.end(); ++i) {
      bool keep = true;
      // The deadline is checked first so a peer dribbling one byte at a time cannot outstay it.
      if (it->deadline.expired()) {
        NZ_LOG(Warning) << "rail " << rail_name_ << ": dropped connection from " << it->remote
                        << ": no complete handshake within " << handshake_timeout_s_ << " s";
        keep = false;
      } else if (n > 0 && fds[i].revents != 0) {
        keep = advance(*it);
      }
      it = keep ? std::next(it) : pending.erase(it);
    }
    if (n > 0 && (fds[1].revents & POLLIN)) accept_new(pending);
  }
}

void Acceptor::accept_new(std::list<Pending>& pending) {
  for (;;) {
    Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      // EMFILE and friends: leave the connection in the backlog and try again on the next wakeup.
      NZ_LOG(Warning) << "rail " << rail_name_ << ": accept() failed: " << errno_text(errno);
      return;
    }
    std::string remote = remote_endpoint(fd.get());
    if (pending.size() >= kMaxPendingHandshakes) {
      NZ_LOG(Warning) << "rail " << rail_name_ << ": dropped connection from " << remote << ": "
                      << pending.size() << " handshakes already in progress";
      continue;
    }
    tune_socket(fd.get(), socket_buffer_bytes_);
    pending.emplace_back(std::move(fd), std::move(remote), AcceptorHandshake(params_),
                         Deadline::after_seconds(handshake_timeout_s_));
  }
}

bool Acceptor::advance(Pending& p) {
  const std::string claimed =
      p.handshake.peer_rank() >= 0 ? " (claiming rank " + std::to_string(p.handshake.peer_rank()) + ")" : "";
  // Replies are a few dozen bytes on a fresh socket: they always fit in the send buffer, so a
  // short deadline only guards against a peer that stopped reading.
  auto reply = [&](FrameType type, const std::string& payload) {
    write_frame(p.fd.get(), type, payload, -1, Deadline::after_seconds(0.1));
  };
  try {
    p.receiver.progress(p.fd.get(), [&](const uint8_t* bytes, uint64_t* length) -> uint8_t* {
      p.header = parse_header(bytes);
      if (p.header.length > kMaxHandshakePayloadBytes)
        throw ProtocolError("handshake frame of " + std::to_string(p.header.length) + " bytes");
      const bool type_ok = p.hello_done ? (p.header.type == FrameType::kAuthResponse ||
                                           p.header.type == FrameType::kAuthResult)
                                        : p.header.type == FrameType::kHello;
      if (!type_ok)
        throw ProtocolError(std::string("unexpected ") + frame_type_name(p.header.type) +
                            " frame during the handshake");
      p.payload.assign(p.header.length, '\0');
      *length = p.header.length;
      return reinterpret_cast<uint8_t*>(p.payload.data());
    });
    if (!p.receiver.done()) return true;
    p.receiver.reset();
    if (!p.hello_done) {
      const std::string challenge = p.handshake.on_hello(p.payload);
      p.hello_done = true;
      reply(FrameType::kChallenge, challenge);
      return true;
    }
    try {
      p.handshake.on_response(handshake_message(p.header.type), p.payload);
    } catch (const AuthenticationError&) {
      try {
        reply(FrameType::kAuthResult, auth_result_payload(false));
      } catch (...) {
        // Best effort: the peer learns of the rejection from the closed connection instead.
      }
      throw;
    }
    reply(FrameType::kAuthResult, auth_result_payload(true));
    NZ_LOG(Debug) << "rail " << rail_name_ << ": authenticated rank " << p.handshake.peer_rank()
                  << " from " << p.remote;
    admit_(p.handshake.peer_rank(), std::move(p.fd), p.remote);
  } catch (const ProtocolError& e) {
    NZ_LOG(Warning) << "rail " << rail_name_ << ": rejected connection from " << p.remote << claimed
                    << ": " << e.what();
  } catch (const SocketFailure& f) {
    NZ_LOG(Warning) << "rail " << rail_name_ << ": dropped connection from " << p.remote << claimed
                    << " during the handshake: " << f.describe();
  } catch (const std::exception& e) {
    NZ_LOG(Warning) << "rail " << rail_name_ << ": dropped connection from " << p.remote << claimed
                    << ": " << e.what();
  }
  return false;
}

}  // namespace nezha::transport::tcp
