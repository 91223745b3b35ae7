// The negotiation channel between ranks, carried over every rail so that losing one rail (rail 0
// included) does not cut the job's control.
//
// One message path (transport/message_path.h) per rail address ("path"), each a full mesh with its own
// connections, and on a host with several ranks a shared-memory path among them. A message to a peer
// goes on that peer's current path: at first the first path that reaches it, reliable paths (shared
// memory: nothing to lose but the peer itself) before the others; the channel numbers messages per peer and keeps them until
// the peer acknowledges them. Every message carries the count received from the other side; a rank
// that owes an acknowledgement and sends nothing to that peer within kAckDelay sends a bare one
// (within a second for what came on a reliable path: nothing is resent from there on a timeout).
// The receiver delivers in number order, drops duplicates and holds early arrivals. When the
// current path fails (the connection errors, the engine marks that rail down or the peer has been
// silent too long, or a message stays unacknowledged past the ack timeout: a pulled cable raises
// no error, and a request lost under one can leave every rank waiting with no data moving for the
// rail watchdog to notice) the sender moves to the next usable path and sends everything
// unacknowledged again, so nothing is lost, doubled or reordered. The ack timeout doubles while
// moving does not help (a stopped peer) and is back to its base once an acknowledgement arrives.
// A rank that hears a peer on another path than its own to that peer follows it there: the peer
// moved because something it sent was lost, and acknowledgements sent back on the old path would be
// lost too. Only a newer move is followed: each move of the pair's path gets a version (one more than
// the newest either side knows, ties broken by the mover's rank) that every message carries, so a
// message still in flight on the old path does not pull the pair back there, and two ranks moving at
// once settle on one path.
//
// Timers (bare acknowledgements, ack timeouts) run inside recv_any(), which the engine calls
// whenever it waits.
//
// Threads: one at a time (whichever thread runs the engine loop: engine.h), except abort().
#pragma once

#include <atomic>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/epoll.h>

#include "common/deadline.h"
#include "transport/message_path.h"

namespace nezha::engine {

struct ControlPathConfig {
  std::string name;        // the rail's name (logs)
  std::string local_addr;  // the rail's address
  std::string kind = "tcp";  // a rail kind that carries control messages (transport::make_message_path)
  std::string host_id;       // the launcher's host entry (a host-local kind's same-host rule)
};

class ControlChannel {
 public:
  // host_board_bytes: RailContext::host_board_bytes of every path (the shared-memory one uses it).
  ControlChannel(const std::vector<ControlPathConfig>& paths, const std::string& secret, int rank,
                 int size, size_t socket_buffer_bytes, size_t host_board_bytes = 0);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  std::vector<std::string> listen_addresses() const;  // one per path
  // addrs[path][rank]: every rank's listen address of that path; an empty one (on every path)
  // leaves that rank out: no connection, and send() to it is an error (a star through rank 0).
  void connect_all(const std::vector<std::vector<std::string>>& addrs, const Deadline& deadline);

  // Queues and sends; on a failing path moves to the next one. Throws PeerError when no path to the
  // peer is left.
  void send(int peer, const std::string& payload);
  // Blocks up to timeout_ms (> 0) in recv_any's stead; returns true when the caller's state may
  // have changed meanwhile (another thread ran the engine loop), and recv_any then returns at once.
  using Wait = std::function<bool(int timeout_ms)>;
  // Next message in order from any peer; std::nullopt when wake_fd is readable or the deadline
  // passes. Runs the timers meanwhile. Throws PeerError when every path to a peer has failed.
  // Blocks in poll() on wake_fd and the paths' epoll set, or in `wait` when given (then only
  // non-blocking polls here).
  std::optional<transport::MessagePath::Message> recv_any(int wake_fd, const Deadline& deadline,
                                                          const Wait& wait = nullptr);
  // The next message recv_any() already took in from the paths (in order), without any I/O or
  // timer; std::nullopt when none is queued. The engine handles a wake-up's messages in one pass.
  std::optional<transport::MessagePath::Message> take_ready();
  // An epoll descriptor readable whenever a path has something to read, kept in step with the
  // paths' connections by recv_any. The engine nests it in the loop thread's wait, so a thread that
  // leads the loop for a while can take the connections out of that wait without waking it.
  int watch_fd() const { return watch_fd_; }
  // Without a system call: whether recv_any has something to return now, as far as the paths can
  // tell cheaply (the shared-memory path can). For a caller that polls briefly before it sleeps.
  bool readable_now() const;
  // recv_any's waits until set back to 1 need not end before `messages` messages came (each
  // path's MessagePath::wake_after_messages): rank 0 waiting for an operation's requests.
  void wake_after_messages(int messages);
  size_t path_count() const { return paths_.size(); }
  // After connect_all: the host board of a path that offers one (MessagePath::host_board), and
  // whether that path links this rank with every other rank (rank 0 of a one-host job).
  transport::MessagePath::HostBoard host_board(bool* reaches_everyone) const;
  // Messages (acknowledgements alone included) this rank handed to reliable paths (shared memory)
  // and to the others, resends included. Any thread.
  uint64_t sent_on_reliable_paths() const { return sent_reliable_.load(std::memory_order_relaxed); }
  uint64_t sent_on_other_paths() const { return sent_other_.load(std::memory_order_relaxed); }
  // The path messages to `peer` take now (its rail's name, "control/<name>"); tests and logs.
  const std::string& path_name_of(int peer) const { return names_.at(static_cast<size_t>(peers_.at(peer).path)); }
  // When recv_any must next run for the timers (bare acknowledgements, ack timeouts, link checks).
  std::optional<Clock::time_point> next_timer(Clock::time_point now) const;

  // The engine marked the rail down (true) or up again (false): peers on it move elsewhere.
  void avoid_path(int path, bool avoid);
  // The peer has been silent for a while: try the next path (the current one may be cut).
  void switch_path(int peer, const std::string& why);
  int path_of(int peer) const { return peers_[peer].path; }

  void abort(const std::string& reason);
  void close();
  // Tests: path `path` fails on this rank only (its sends and receives throw).
  void testing_abort_path(int path, const std::string& why) { paths_.at(path)->abort(why); }
  // Tests: path `path` loses everything silently on this rank, as under a pulled cable.
  void testing_black_hole(int path) { black_hole_.at(path) = true; }
  // Tests: this rank's link of path `path` reports `why` as its fault (MessagePath::link_fault).
  void testing_link_fault(int path, const std::string& why) { testing_link_faults_.at(path) = why; }

 private:
  // Orders the moves of a pair's path: a higher version wins; at equal versions, the higher rank.
  struct Route {
    uint64_t version = 0;
    uint64_t mover = 0;
    bool operator<(const Route& o) const { return version != o.version ? version < o.version : mover < o.mover; }
  };
  struct PeerState {
    int path = 0;
    Route route;  // the newest move of this pair's path this rank knows
    uint64_t next_send = 0;
    struct Unacked {
      uint64_t number;
      std::string envelope;
      Clock::time_point sent_at;  // last (re)sent
    };
    std::deque<Unacked> unacked;
    Clock::duration ack_timeout{};           // current; doubles while moving does not help
    std::optional<Clock::time_point> ack_owed_since;  // received, not yet acknowledged
    bool ack_owed_reliable = true;  // everything owed came on reliable paths (ack_delay_of)
    uint64_t next_recv = 0;
    std::map<uint64_t, std::string> early;  // arrived ahead of a gap (after a path switch)
    std::vector<bool> broken;               // per path: its connection failed
    std::string last_error;
  };
  void flush(int peer, size_t from);
  // `any_path`: avoided paths are as good as the others (the preferred ones have not worked).
  void move_peer(int peer, const std::string& why, bool after_current, bool any_path = false);
  void on_envelope(int peer, int path, std::string envelope);
  void path_failed(int path, int peer, const std::string& why);
  // Bare acknowledgements due, ack timeouts passed; returns when to run again.
  std::optional<Clock::time_point> run_timers(Clock::time_point now);
  std::optional<Clock::time_point> next_timer_of(const PeerState& p, Clock::time_point now) const;
  // How long an acknowledgement owed to `p` may wait for a message to carry it.
  static Clock::duration ack_delay_of(const PeerState& p);
  // Registers fds[1..] (the paths' descriptors; fds[0] is the caller's wake fd) in watch_fd_ and
  // notes each one's path (path i's: [first_fd[i], first_fd[i + 1])).
  void sync_watch(const std::vector<pollfd>& fds, const std::vector<size_t>& first_fd);
  void send_bare_ack(int peer);
  void send_on_path(int peer, std::string& envelope);  // stamps the current route first
  int pick_path(const PeerState& p, bool after_current, bool any_path = false) const;
  void set_path(int peer, int path, const std::string& why);  // logs a change
  // Heard the peer on `path` with its route: follows it there when that move is newer than ours.
  void follow(int peer, int path, const Route& route);

  int rank_, size_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<transport::MessagePath>> paths_;
  std::vector<int> order_;  // the paths in order of preference: reliable ones first
  std::vector<bool> avoided_;
  std::vector<bool> black_hole_;
  std::vector<std::string> testing_link_faults_;
  struct LinkCheck {  // a path's carrier, as last read (run_timers)
    bool checked = false;
    Clock::time_point at;
    std::string fault;
  };
  std::vector<LinkCheck> links_;
  std::vector<PeerState> peers_;
  std::vector<bool> linked_;  // per rank: connected (connect_all); never this rank itself
  // The linked ranks, in order: what the per-wait loops (timers) walk. A worker of the star has only
  // rank 0, and its every wait would otherwise touch every rank's state (at 128 ranks on one host,
  // cold cache lines on every wake-up: benchmarks/SCALE.md).
  std::vector<int> linked_peers_;
  std::deque<transport::MessagePath::Message> ready_;
  std::exception_ptr deferred_error_;  // a peer lost after sending what ready_ still holds
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> sent_reliable_{0}, sent_other_{0};
  int watch_fd_ = -1;
  std::vector<int> watched_;  // the paths' descriptors as last registered in watch_fd_, in poll order
  std::unordered_map<int, int> path_of_fd_;  // of the watched descriptors
  std::vector<epoll_event> events_;          // epoll_wait's buffer, one per watched descriptor
};

}  // namespace nezha::engine
