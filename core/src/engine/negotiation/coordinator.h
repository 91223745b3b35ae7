// The negotiation logic that runs on rank 0 (pure: no sockets, no threads, time passed in).
//
// Every rank sends the coordinator the metadata of each tensor it submits. A tensor is *ready*
// when every rank has submitted it (ranks that called join() count as having submitted any
// allreduce, contributing zeros). Ready tensors are validated (a shape/dtype/op/root mismatch
// becomes an error response naming the tensor, the field and the ranks), fused (consecutive
// allreduces, allgathers, reducescatters or broadcasts of one kind, dtype and set, up to the fusion
// threshold: fusion.h) and returned in the order every rank must execute them. Ranks may submit names in any order.
//
// When to dispatch. A lone ready tensor goes out at once (no fixed cycle delay). While other
// tensors are only partially submitted, ready ones are held up to cycle_time so they can be fused
// with tensors about to become ready (gradients arrive in bursts).
//
// Small allreduces, broadcasts and allgathers (control_inline.h) arrive with their inputs; their
// response carries the result rank 0 computed, is never fused with operations for the rails, and is
// never held. Such allreduces in a row share one response and result (fusion.h, merged_inline).
//
// Process sets (process_sets.h): a tensor of set S is ready when every member of S submitted it; it
// is validated among them, fused only with tensors of S, never cached and never done inline.
//
// Response cache. Once a tensor has gone through negotiation, each rank remembers the id the
// coordinator gave it; the next submission with identical metadata sends only (name, id). When
// every rank submits by id, validation and metadata transfer are skipped.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/deadline.h"
#include "engine/process_sets.h"
#include "engine/request.h"

namespace nezha::engine {

struct CoordinatorOptions {
  int size = 1;
  size_t fusion_threshold = 64 << 20;
  size_t unfused_bytes = 1 << 20;  // see runs_unfused()
  double cycle_time_s = 0.001;
  double stall_check_s = 60;
  double stall_shutdown_s = 0;  // 0: never fail stalled tensors
  size_t cache_capacity = 4096;
  const ProcessSetTable* process_sets = nullptr;  // null: only the global set exists
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions opt);

  // Records rank's submissions. Throws ProtocolError for a cache id the coordinator never issued.
  void submit(int rank, std::vector<Request> requests, Clock::time_point now);

  // Responses to execute now, in order. Empty while holding ready tensors for fusion.
  std::vector<Response> take_ready(Clock::time_point now);

  // Rank 0's rail estimates as they stand: fusion lets lone operations start from
  // scaled_unfused_bytes(unfused_bytes, estimates) (request.h).
  void set_rail_estimates(const std::vector<multirail::RailEstimate>& estimates);

  // When take_ready (or check_stalls) must run again even if no message arrives.
  std::optional<Clock::time_point> next_wakeup(Clock::time_point now) const;

  // Warns once per tensor that some ranks submitted and others did not for stall_check_s; with
  // stall_shutdown_s returns error responses for tensors stalled that long.
  std::vector<Response> check_stalls(Clock::time_point now);

  // The stall warnings check_stalls logged since the last call, for the engine to send to every
  // other rank: a rank blocked on a tensor learns which ranks it waits for, and a rank that never
  // submitted it learns that others wait for it.
  std::vector<std::string> take_notices();

  bool has_pending() const { return !pending_.empty() || !ready_.empty() || !failed_.empty(); }
  // How many other ranks' requests must come, at least, before some pending tensor is complete
  // (the fewest any lacks, not counting rank 0's own); 1 when none is pending, or something is
  // due without any (a ready tensor, an error to send, a group's member complete). Rank 0 may sleep
  // until that many messages came.
  int fewest_requests_missing() const;

 private:
  struct Pending {
    std::vector<std::optional<Request>> by_rank;
    std::vector<bool> from_cache;
    std::shared_ptr<const std::vector<int>> members;  // of its process set; null: every rank
    int submitted = 0;
    Clock::time_point first_seen;
    bool stall_warned = false;
  };

  void add_join(int rank);
  // An error response for `req` (a tensor that cannot be negotiated), sent with the next batch.
  void fail_request(const Request& req, const std::string& error);
  void promote_ready(Clock::time_point now);
  bool complete(const Pending& p) const;
  std::optional<std::string> validate(const std::string& name, const Pending& p) const;
  Response build(const std::string& name, Pending& p);
  void remember(const std::string& name, const Pending& p, Response& r);
  std::vector<Response> fuse(std::vector<Response> in) const;
  // Appends r to out.back() when both are inline allreduces that merge (fusion.h): true if it did.
  bool merged_inline(std::vector<Response>& out, const Response& r) const;
  std::vector<Response> take_ready_built(Clock::time_point now);
  // While the others are held for fusion: the ready tensors whose response carries a result.
  std::vector<Response> take_inline_ready();
  std::string missing_ranks(const Pending& p) const;
  // A grouped tensor failed validation: its group's other members fail too, those pending now and
  // those each rank still owes by its own group_size (else a rank whose group was larger waits for
  // them forever).
  void fail_group(const std::string& group, const std::string& error);

  CoordinatorOptions opt_;
  size_t unfused_bytes_;  // opt_.unfused_bytes scaled to the rails (set_rail_estimates)
  std::map<std::string, Pending> pending_;
  std::vector<std::pair<std::string, Pending>> ready_;  // in the order they became ready
  std::optional<Clock::time_point> oldest_ready_;
  std::vector<bool> joined_;
  int joined_count_ = 0;  // ranks with joined_ set
  int last_joined_ = -1;
  std::unordered_map<std::string, int32_t> cache_index_;
  std::vector<std::vector<Request>> cache_;  // [id][rank]
  std::vector<std::string> notices_;
  struct FailedGroup {
    std::vector<int32_t> owed;  // per rank: members not yet seen
    std::string error;
  };
  std::map<std::string, FailedGroup> failed_groups_;
  std::vector<Response> failed_;  // errors decided outside take_ready, sent with its next batch
};

}  // namespace nezha::engine
