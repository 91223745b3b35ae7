// OfiRail: a Rail over libfabric RDM endpoints and tagged messages. The same code runs over
// verbs;ofi_rxm on InfiniBand/RoCE and over tcp;ofi_rxm or shm anywhere (CI tests it over tcp).
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
// Failures. A completion error, short or truncated message, or timeout closes that peer on this rail
// (later calls throw PeerError at once); receives still posted for it are cancelled. abort() wakes a
// waiting data call through an eventfd; the rail stays poisoned until reset(), which cancels and
// reaps what is still posted and bumps the epoch; connect() then authenticates every pair again.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
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

class OfiRail : public Rail {
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

 private:
  struct Stream;  // one direction of a transfer (ofi_rail.cc)
  struct Op;      // one posted chunk, owning a staging slot

  void transfer(Stream* out, Stream* in, const Deadline& deadline);
  void post(Stream& s);
  void reap(const Deadline& deadline, bool block);
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
};

// The factory's maker for kind "ofi" (rail_kinds.cc). Without libfabric at build time it throws a
// NezhaError saying so.
std::unique_ptr<Rail> make_ofi_rail(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
