// AggRail: the client of nezha-aggd, a collective rail (collective_rail.h). Every rank sends each
// allreduce share to the daemon once, in chunks, and receives the sum once (a ring sends 2(n-1)/n of
// it through each link).
//
// Protocol: agg_protocol.h. The job id is rank 0's local_address() (random bytes, exchanged through
// the rendezvous), so two jobs on one daemon never meet; each connect() is a new epoch of the job, so a
// rail re-admitted after failover starts afresh on the daemon. The daemon proves, and we prove, the
// daemon key (NEZHA_AGG_SECRET or the spec's secret_file option; HMAC as on every connection).
//
// Sends are self-clocked: at most `window` chunks are unanswered; each result lands in the output at
// its chunk's offset, which the daemon only answers after every rank (us included) sent that chunk, so
// output may alias input. A failure (daemon gone, kError, timeout, abort) throws from wait() naming the
// daemon and the rail, poisons the rail until reset() + connect(), and so reaches the executor's
// failover like a failed point-to-point share.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "transport/collective_rail.h"
#include "transport/rail_factory.h"
#include "transport/tcp/link_state.h"

namespace nezha::transport {

struct AggRailConfig {
  std::string name;        // as the user named it ("agg:10.50.0.100:7000" -> "10.50.0.100:7000")
  std::string daemon;      // ADDR:PORT of nezha-aggd
  std::string secret;      // the daemon's key
  size_t chunk_bytes = 256 << 10;
  uint32_t window = 8;
  double gbps_prior = 0;   // the link's speed if known (0: measured by calibration)
  double handshake_timeout_s = 5;
};

class AggRail final : public CollectiveRail {
 public:
  AggRail(AggRailConfig config, int rank, int size);
  ~AggRail() override;

  const RailProperties& properties() const override { return properties_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string local_address() const override { return nonce_; }
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override;
  void close() override;
  RailCounters counters() const override;
  void abort(const std::string& reason) override;
  // The interface this rank reaches the daemon through lost its carrier: a cut reported at once.
  std::string link_fault() const override;
  // The daemon's host acknowledges what we sent: silence is then the daemon waiting for a late rank
  // (its chunk not sent yet), not a broken path, and the watchdog gives it twice the limit.
  bool delivering(std::chrono::milliseconds quiet) const override;

  bool reduces(DataType dtype, ReduceOp op) const override;
  std::unique_ptr<CollectiveRequest> start_allreduce(const void* input, void* output, size_t count,
                                                      DataType dtype, ReduceOp op, uint64_t seq,
                                                      OverwriteHook before_overwrite = {}) override;

 private:
  class Request;
  friend class Request;
  // Writes/reads all of a small frame, bounded by the deadline (handshake only).
  void send_frame(const std::string& frame, const Deadline& deadline);
  std::string recv_frame(uint32_t expected_type, const Deadline& deadline);
  [[noreturn]] void fail(const std::string& what);  // poisons the rail and throws what
  std::string who() const;  // "rail '<name>' (nezha-aggd at <addr>)"
  void check_usable() const;

  AggRailConfig config_;
  int rank_, size_;
  RailProperties properties_;
  std::string nonce_;
  uint64_t job_ = 0, epoch_ = 0;
  int fd_ = -1;
  std::atomic<int> watched_fd_{-1};  // fd_ once joined, for delivering() (another thread)
  int wake_fd_ = -1;
  mutable std::mutex link_mu_;
  std::unique_ptr<tcp::LinkState> link_;  // the local interface of the connection; null until joined
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex reason_mu_;
  std::string abort_reason_;
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
};

std::unique_ptr<Rail> make_agg_rail(const RailSpec& spec, const RailContext& ctx);

}  // namespace nezha::transport
