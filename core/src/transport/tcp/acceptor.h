// The listening side of a TCP rail: one thread that accepts connections and runs the acceptor half
// of the authentication handshake (auth.h) on all of them at once, in one poll() loop, each with its
// own short deadline. A silent or garbage-writing stranger is therefore dropped after at most the
// handshake timeout and never delays a legitimate peer. Authenticated connections are handed to the
// rail through a callback; everything else is closed and logged with the remote address. Nothing is
// ever thrown out of the loop.
#pragma once

#include <functional>
#include <list>
#include <string>
#include <thread>

#include "transport/auth.h"
#include "transport/tcp/socket.h"

namespace nezha::transport::tcp {

class Acceptor {
 public:
  // Receives each authenticated connection (non-blocking, tuned) with the peer's proven rank. Runs
  // on the accept thread; must not block.
  using AdmitFn = std::function<void(int peer_rank, Fd fd, const std::string& remote)>;

  // Starts the accept thread on an already listening socket.
  Acceptor(Fd listener, HandshakeParams params, std::string rail_name, double handshake_timeout_s,
           size_t socket_buffer_bytes, AdmitFn admit);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Stops and joins the thread, closes the listener and every half-done handshake. Idempotent.
  void stop();

 private:
  struct Pending;
  void loop();
  void accept_new(std::list<Pending>& pending);
  // Returns false when the connection is finished with (admitted or rejected).
  bool advance(Pending& p);

  Fd listener_;
  Fd stop_fd_;  // eventfd: readable once stop() was called
  HandshakeParams params_;
  std::string rail_name_;
  double handshake_timeout_s_;
  size_t socket_buffer_bytes_;
  AdmitFn admit_;
  std::thread thread_;
};

}  // namespace nezha::transport::tcp
