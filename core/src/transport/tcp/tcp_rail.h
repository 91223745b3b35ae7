// TcpRail: a point-to-point rail over one TCP (or MPTCP) connection per peer, all bound to one
// local address so the rail's traffic leaves on its own NIC.
//
// Connections. The constructor binds and listens on local_addr:0 and starts the accept thread
// (tcp/acceptor.h). connect() dials every lower rank and waits for every higher rank; every
// connection is authenticated (auth.h) before it carries a byte of data. With
// connect_on_first_use (data rails), connect() only learns the addresses: the first data call to a
// peer dials it (a lower rank) or waits for it to dial (a higher one; both ends of a transfer call,
// so the dialer always comes). A job then holds the connections its algorithms use (ring
// neighbours, log-step partners; every pair only after an alltoall), not n^2 / 2 from the start. The listener stays open for
// the life of the rail: strangers and failed handshakes are logged and dropped there, so they never
// disturb a running job.
//
// Data path. send/recv/sendrecv/send_message/recv_message_any/read_polled are made by one thread at
// a time (the rail's worker, per rail.h). Each runs a poll() loop over the sockets it needs plus the
// abort eventfd (read_polled: the caller's poll), so abort() from any thread wakes it at once;
// frames go out with one sendmsg() from the caller's buffer and data frames come in straight to it
// once their header has been checked (frame.h).
//
// Control messages (kControl frames, variable length up to kMaxControlPayloadBytes) carry the
// engine's negotiation. Their tag is a per-peer sequence number, so a lost or duplicated message is a
// ProtocolError. A message is sent whole before send_message returns; keep messages well below the
// socket buffer size when two ranks may send to each other without receiving (negotiation messages
// are a few KB). They are read ahead, whatever a socket holds at once (tcp/control_inbox.h), so a
// rail that receives control messages carries nothing else (the control channel's paths).
//
// Failures. A reset, EOF, protocol violation or timeout closes that peer's connection; later calls
// to the peer throw PeerError at once, naming the first failure. abort() poisons the whole rail
// until reset(); connections are accepted only during connect().
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <poll.h>
#include <string>
#include <vector>

#include "transport/auth.h"
#include "transport/message_path.h"
#include "transport/rail.h"
#include "transport/rail_factory.h"
#include "transport/tcp/acceptor.h"
#include "transport/tcp/control_inbox.h"
#include "transport/tcp/frame_stream.h"
#include "transport/tcp/link_state.h"
#include "transport/tcp/socket.h"

namespace nezha::transport {

struct TcpRailConfig {
  std::string name;          // user-visible rail name ("lo", "eth1", "10.50.0.0/24", "control")
  std::string local_addr;    // IPv4 address to bind (listen and connect source), e.g. "127.0.0.1"
  int rail_index = 0;        // identifies the rail in the handshake (control channel uses -1)
  bool mptcp = false;        // open sockets as IPPROTO_MPTCP (Linux; fails with a clear error)
  size_t socket_buffer_bytes = 4 << 20;
  std::string secret;        // job secret for the HMAC handshake
  double handshake_timeout_s = 5.0;  // longest a single handshake may take (either side)
  bool connect_on_first_use = false;  // see Connections above; control paths connect eagerly
  size_t max_share_bytes = 0;        // RailProperties::max_share_bytes (0: no limit)
};

class TcpRail : public PointToPointRail, public MessagePath {
 public:
  TcpRail(TcpRailConfig config, int rank, int size);
  ~TcpRail() override;
  TcpRail(const TcpRail&) = delete;
  TcpRail& operator=(const TcpRail&) = delete;

  std::string local_address() const override;  // "ip:port" of the listener

  // Full mesh: connect to every lower rank, accept every higher rank (authenticated). Strangers and
  // failed handshakes are dropped and logged, and accepting continues. Throws NezhaError naming the
  // ranks still missing (and why) when the deadline passes. connect_on_first_use: no connection
  // yet (Connections above).
  void connect(const std::vector<std::string>& listen_addrs_by_rank, const Deadline& deadline) override;
  bool reaches(int peer) const override;

  const RailProperties& properties() const override { return properties_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override;
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override;
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                     int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                     const Deadline& deadline) override;
  // Half the smallest SO_SNDBUF of the connected peers' sockets (the kernel doubles what was asked
  // for, to cover its bookkeeping; it also caps it at net.core.wmem_max), read back after connect
  // (connect_on_first_use: from a socket tuned alike).
  size_t send_buffer_bytes() const override { return send_buffer_bytes_.load(); }

  RailCounters counters() const override;
  void abort(const std::string& reason) override;
  // The carrier of the interface holding config.local_addr (not for MPTCP: its subflows outlive
  // any one interface).
  std::string link_fault() const override { return link_ ? link_->fault() : std::string(); }
  bool delivering(std::chrono::milliseconds quiet) const override;

  // MessagePath (message_path.h): the control channel's calls.
  void send_message(int peer, const std::string& payload, const Deadline& deadline) override;
  // Waits until one whole kControl message has arrived from any peer (returns it), or wake_fd (may
  // be -1) becomes readable (returns std::nullopt without reading wake_fd), or the deadline passes
  // (std::nullopt). Messages from one peer arrive in order; peers are served round robin.
  // Partially received messages are kept across calls.
  std::optional<Message> recv_message_any(int wake_fd, const Deadline& deadline) override;
  // For waiting on several rails at once: appends the abort eventfd and every connected peer's
  // socket (POLLIN). When any is readable, recv_message_any(-1, an expired deadline) makes progress
  // without blocking, and read_polled() without polling again.
  void append_poll_fds(std::vector<struct pollfd>& fds) const override;
  void read_polled(const struct pollfd* fds, size_t n, std::vector<Message>& out) override;

  // Idempotent; also run by the destructor. Must not race a data call (use abort() for that).
  void close() override;

  // Re-admission after a failure: drops every connection and clears an abort, so that the next
  // connect() builds a fresh mesh on the same listener (every rank must reset before any rank
  // dials). Must not race a data call.
  void reset() override;

 private:
  struct Peer {
    tcp::Fd fd;
    std::string closed_reason;  // why fd was closed after an error; empty while healthy
    uint64_t control_sent = 0;  // sequence number (frame tag) of the next control message
    tcp::ControlInbox control_in;
  };
  struct Outgoing;
  struct Incoming;

  void connect_to(int peer, const std::string& endpoint, const Deadline& deadline);
  void admit(int peer, tcp::Fd fd, const std::string& remote);
  void transfer(Outgoing* out, Incoming* in, const Deadline& deadline);
  int live_fd(int peer, const char* what);
  // connect_on_first_use: makes (or waits for) the connection to peer unless it exists or failed.
  void connect_on_first_use(int peer, const Deadline& deadline);
  void close_peer(int peer, const std::string& why);  // keeps the first reason
  [[noreturn]] void fail_peer(int peer, const std::string& what);  // close_peer + PeerError
  void throw_if_aborted() const;
  void read_control(int peer);  // control_in -> control_ready_; PeerError / ProtocolError close it
  std::string rank_name(int peer) const;

  TcpRailConfig config_;
  RailProperties properties_;
  int rank_;
  int size_;
  std::string listen_address_;
  std::vector<Peer> peers_;
  // The ranks with an address at the last connect(): the only ones that can have a socket. The
  // control path's per-wait calls (append_poll_fds, read_polled) walk these, not every rank: a
  // worker of the negotiation star has rank 0 alone.
  std::vector<int> addressed_peers_;
  std::unique_ptr<std::atomic<bool>[]> reachable_;  // per peer: connected and not closed (reaches())
  std::unique_ptr<std::atomic<int>[]> watched_fds_;  // per peer: its socket while reachable, else -1
  tcp::Fd abort_fd_;  // eventfd, readable once abort() was called; in every poll set
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<size_t> send_buffer_bytes_{0};  // 0 until a mesh is connected
  size_t next_control_peer_ = 0;  // round-robin start for recv_message_any
  std::deque<Message> control_ready_;  // whole control messages read, not yet returned

  mutable std::mutex mu_;  // guards the fields below, and peers_[*].fd while admitting_
  std::condition_variable admitted_;
  bool admitting_ = true;  // true until connect() returns (for the life of the mesh when lazy)
  std::vector<std::string> endpoints_;  // connect_on_first_use: every rank's listen address
  std::string abort_reason_;
  std::unique_ptr<tcp::Acceptor> acceptor_;
  std::unique_ptr<tcp::LinkState> link_;  // null for MPTCP and without a local address
};

// The factory's maker for kinds "tcp" and "mptcp" (rail_kinds.cc): binds spec.local_addr.
std::unique_ptr<Rail> make_tcp_rail(const RailSpec& spec, const RailContext& ctx);
// The same, as a control-channel message path (rail_kinds.cc's message-path table).
std::unique_ptr<MessagePath> make_tcp_message_path(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
