// OfiRail: a point-to-point rail over libfabric RDM endpoints and tagged messages. The same code
// runs over verbs;ofi_rxm on InfiniBand/RoCE and over tcp;ofi_rxm or shm anywhere (CI tests it over
// tcp).
//
// Wire. Each rail message of N bytes travels as ceil(N / chunk) tagged messages (one when N is 0)
// with the same wire tag, several in flight (window), copied through the registered staging pool
// (ofi_endpoint.h). Wire tag bits: 63 = handshake class, 62 = "last chunk" (a receive ignores it and
// then checks it, so sizes that differ only in the chunk count are still caught), 56-61 = the
// connection epoch (bumped by reset(), so a straggler of a failed mesh never matches a receive of
// the re-formed one), 0-55 = the caller's tag (must be < 2^56; collective tags are seq << 20 | step).
// Chunks of one message are matched in order (FI_ORDER_SAS, directed receives from that peer).
//
// Connections. local_address() carries the provider name and the fi_getname() bytes (ofi_address.h).
// connect() inserts every peer into the address vector and runs the job-secret challenge/response of
// auth.h with each peer (the higher rank is the connector) over handshake-class messages, before any
// data receive to that peer is posted: data from a peer that has not proven the secret is never
// accepted. Pairs run in one global order, so the sequential handshakes cannot deadlock.
//
// Send buffering and the progress thread. Like a TCP socket buffer, a message of at most
// send_buffer_bytes() is handed over once all its chunks are copied into staging slots and posted;
// the call returns before the provider completes them (at most `window` send chunks are posted at a
// time, so receives always find slots). That lets the ring keep one segment in flight ahead of the
// one it receives (collectives/ring.cc). ofi_rxm progresses manually: a rendezvous send moves only
// while its sender calls into libfabric, so each rail has a progress thread that, while such detached
// sends are outstanding and no data call is driving the rail, reads the completion queue (sleeping on
// its fd; without one, in 1 ms slices). It sleeps on a condition variable otherwise: an idle rail
// burns no CPU. A detached send that fails closes its peer; the next call to that peer throws.
// Only over ofi_rxm (verbs;ofi_rxm, tcp;ofi_rxm): libfabric 1.17's shm provider sometimes leaves the
// second of two queued messages undelivered, so over it every send waits for its completion.
// One lock serialises libfabric and the rail's slot/peer state between the two threads; the data
// thread releases it only while sleeping in poll(), and the progress thread stays off the completion
// queue while a data call is running, so completions are read by the thread that waits for them.
//
// Stale sends. ofi_rxm completes a rendezvous send only once the receiver matches it; a send left
// posted by a failed mesh (the receiver failed over, or reset first) would keep its staging slot
// forever, and a few failovers would leave no slot to send with. So reset(), which the engine runs on
// every rank together before re-admission, accepts and discards any message of an earlier epoch
// (ofi_rail_lifecycle.cc) until its own sends are done and the stale traffic has stopped, at most 1 s.
//
// Failures. A completion error, short or truncated message, or timeout closes that peer on this rail
// (later calls throw PeerError at once); receives still posted for it are cancelled. abort() wakes a
// waiting data call through an eventfd; the rail stays poisoned until reset(), which cancels and
// reaps what is still posted and bumps the epoch; connect() then authenticates every pair again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/rail.h"
#include "transport/rail_factory.h"

namespace nezha::transport {

struct OfiRailConfig {
  std::string name;             // user-visible rail name ("tcp;ofi_rxm@10.50.0.0/24")
  std::string provider;         // libfabric provider: "tcp;ofi_rxm", "verbs;ofi_rxm", "shm", ...
  std::string node;             // IPv4 address to bind; empty for providers that take none (shm)
  int rail_index = 0;           // bound into the handshake
  std::string secret;           // job secret
  double handshake_timeout_s = 5.0;
  size_t chunk_bytes = 1 << 20;  // bytes per tagged message (= staging slot size)
  size_t window = 8;             // chunks in flight per direction
  size_t max_share_bytes = 0;    // RailProperties::max_share_bytes
};

namespace ofi {
class OfiEndpoint;
}

class OfiRail : public PointToPointRail {
 public:
  // Opens the provider's endpoint and registers the staging pool (2 * window chunks). Throws
  // NezhaError naming the provider when libfabric does not have it.
  OfiRail(OfiRailConfig config, int rank, int size);
  ~OfiRail() override;
  OfiRail(const OfiRail&) = delete;
  OfiRail& operator=(const OfiRail&) = delete;

  const RailProperties& properties() const override { return properties_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::string local_address() const override { return local_address_; }
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override;
  void close() override;
  bool reaches(int peer) const override;

  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override;
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override;
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                     int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                     const Deadline& deadline) override;

  RailCounters counters() const override;
  void abort(const std::string& reason) override;
  size_t send_buffer_bytes() const override { return buffered_sends_ ? config_.window / 2 * config_.chunk_bytes : 0; }

 private:
  struct Stream;  // one direction of a transfer (ofi_rail.cc)
  struct Op;      // one posted chunk, owning a staging slot
  struct Driving; // scope in which a data call reads the completion queue (ofi_rail.cc)

  using Lock = std::unique_lock<std::mutex>;
  // transfer, post, reap, orphan, check_peer and close_peer run with fab_mu_ held (`lk`).
  void transfer(Lock& lk, Stream* out, Stream* in, const Deadline& deadline);
  void post(Stream& s);
  void reap(Lock& lk, const Deadline& deadline, bool block);
  void progress_loop();
  void stop_progress();
  // reset(): accepts and discards messages of every earlier epoch, so peers' sends of them complete.
  void drain_stale_epoch(Lock& lk);
  void orphan(Stream& s);  // detaches s's posted chunks (cancelling receives) after s failed
  void handshake(int peer, const Deadline& deadline);
  void send_small(int peer, uint64_t wire_tag, const std::string& payload, const Deadline& deadline);
  std::string recv_small(int peer, uint64_t wire_tag, size_t max_bytes, const Deadline& deadline);
  void check_peer(int peer, const char* what) const;
  void close_peer(int peer, const std::string& why);
  void throw_if_aborted() const;
  uint64_t data_tag(uint64_t tag, bool last) const;

  OfiRailConfig config_;
  RailProperties properties_;
  int rank_;
  int size_;
  std::unique_ptr<ofi::OfiEndpoint> endpoint_;
  std::string local_address_;
  std::vector<Op> ops_;              // one per staging slot
  std::vector<size_t> free_slots_;
  std::vector<uint64_t> peer_addr_;  // fi_addr_t per rank (FI_ADDR_UNSPEC until connect)
  std::vector<std::string> peer_raw_;  // the address bytes peer_addr_ was inserted from
  std::vector<std::string> closed_reason_;  // per peer, empty while healthy
  std::unique_ptr<std::atomic<bool>[]> reachable_;
  uint64_t epoch_ = 0;
  int abort_fd_ = -1;  // eventfd, readable once abort() was called
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  mutable std::mutex mu_;  // guards abort_reason_
  std::string abort_reason_;

  std::mutex fab_mu_;  // libfabric calls, ops_, free_slots_, peer state, the fields below
  std::condition_variable progress_cv_;
  bool active_ = false;        // a data call (or connect/reset) is driving the completion queue
  bool stop_ = false;          // close(): the progress thread exits
  size_t sends_busy_ = 0;      // send chunks posted and not yet completed
  size_t detached_sends_ = 0;  // ... of which no call is waiting for (buffered or abandoned)
  uint32_t drain_patterns_posted_ = 0;  // drain_stale_epoch's receives still posted, one bit each
  Clock::time_point last_drained_{};
  int wake_fd_ = -1;           // eventfd: wakes the progress thread's poll() at close
  std::thread progress_;       // started last in the constructor
  // Send buffering is for providers layered on ofi_rxm (verbs, tcp), whose behaviour the tests
  // establish; libfabric 1.17's shm provider sometimes never delivers a second queued message.
  bool buffered_sends_ = false;
};

// The factory's maker for kind "ofi" (rail_kinds.cc). Without libfabric at build time it throws a
// NezhaError saying so.
std::unique_ptr<Rail> make_ofi_rail(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
