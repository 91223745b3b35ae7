// Cache rounds: how steady-state (cached) allreduces skip the coordinator round trip. Pure logic: no
// sockets, no threads, time passed in; the engine moves the messages.
//
// The response cache. Once rank 0 has negotiated a tensor it gives it a cache id (Response::
// cache_ids); every rank learns (name, id, metadata) when it executes that response. Responses run
// in the same order everywhere and a name cannot be resubmitted before its previous instance ran, so
// every rank's cache holds the same entries whenever one of them is used.
//
// Rounds. A cached allreduce (same metadata as cached, no group) is not sent to rank 0. Instead the
// ranks run lock-step rounds over the control mesh, only while some rank has something new: round k
// starts on a rank when cached tensors were added (or a join() or an invalidation happened) since
// its last round, or when a peer's round-k vector arrives (it must answer). Each rank sends every
// other rank {k, its pending cache ids, its join state, ids to invalidate; rank 0 adds its cost
// estimates}. Round k completes on a rank once it holds all size vectors; every rank then computes
// the same result from the same vectors: an id pending on every rank (a rank with a join() in flight
// counts for any id, contributing zeros) is executed, in ascending id order, fused like the
// Coordinator fuses; the rest stays pending. A rank whose pending set did not change starts no round,
// so an idle job exchanges nothing (the engine still sleeps).
//
// Total order with rank 0's responses. Rank 0 tags every ResponseList with the last round it has
// *started* (tag()), and every rank, rank 0 included, executes a list tagged k only after its own
// round k completed (hold()/next()). That list comes before round k+1 everywhere: rank 0 sends its
// round-(k+1) vector after the list, on the same FIFO connection, and no rank completes round k+1
// without that vector, by when the list is already held and next() releases it first. (Tagging with
// the last *completed* round would break this: rank 0 may have sent its round-(k+1) vector already.)
// So every rank executes ..., round k ops, lists tagged k in send order, round k+1 ops, ... and the
// per-rail operation order (which pairs collectives) is the same on every rank.
//
// Invalidation. A rank that submits a cached name with other metadata sends the full request to rank
// 0 and announces the id in its next vector. At that round's completion every rank erases the entry
// (same point of the total order; unless re-learned since: versions_) and a rank that had the id
// pending moves it to rank 0 in full
// (requeue); the Coordinator then validates as for any new tensor (a mismatch is an error on every
// rank; a match re-caches it under the same id).
//
// Join. Joined ranks count as ready for every cached allreduce while their join() is in flight. The
// join state travels as a generation (joins completed + 1), so a vector sent just before the join
// finished is recognised as stale by every rank alike. Rank 0 holds the join response until a round
// has completed in which every rank was joined (join_may_complete()): ids still pending anywhere run
// in that round, before the join, as on the coordinator path.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/deadline.h"
#include "engine/negotiation/message_codec.h"
#include "engine/request.h"

namespace nezha::engine {

struct CacheRoundsOptions {
  int rank = 0;
  int size = 1;
  bool enabled = true;  // NEZHA_CACHE_ROUNDS; never with one rank (nothing to skip)
  size_t fusion_threshold = 64 << 20;
  size_t unfused_bytes = 1 << 20;  // see runs_unfused()
};

// What one completed round asks this rank to do, identical on every rank except `requeue`.
struct RoundOutcome {
  uint64_t round = 0;
  std::vector<Response> ops;         // cached allreduces to execute now, in order (plans not set)
  std::vector<std::string> requeue;  // names this rank had pending that were invalidated
  std::vector<multirail::RailEstimate> estimates;  // rank 0's, from its vector: plan with these
};

// The next thing to execute in the total order: a round's ops or a list from rank 0.
struct RoundStep {
  std::optional<RoundOutcome> round;
  std::optional<ResponseList> responses;
};

struct RoundStall {
  std::string name;
  double age_s = 0;
  std::vector<int> missing_ranks;  // whose vector in the last completed round lacked it
};

class CacheRounds {
 public:
  explicit CacheRounds(CacheRoundsOptions opt);

  // --- The response cache.
  // Remembers names[index] of an executed response under id (own: this rank's request).
  void learn(int32_t id, const Request& own, const Response& resp, size_t index);
  enum class Route { kFull, kBrief, kRound };
  struct Decision {
    Route route = Route::kFull;
    int32_t id = -1;
    bool invalidate = false;  // cached with other metadata: announce so no rank waits on a round
    uint32_t version = 0;     // of the cache entry (announce with it)
  };
  Decision route(const Request& req) const;

  // --- Local events.
  void add_pending(int32_t id, Clock::time_point now);
  void announce_invalidation(int32_t id, uint32_t version);
  void forget_pending(const std::string& name);  // executed through the coordinator after all
  void set_joined();                             // a join() was submitted
  void join_completed();                         // a join response was executed (total order)
  bool join_may_complete() const;                // rank 0: may the join response go out now?

  // --- Rounds.
  bool round_due() const;  // start_round() has something to send
  // Starts the next round; the message goes to every other rank. Rank 0 passes its estimates.
  RoundMessage start_round(Clock::time_point now, std::vector<multirail::RailEstimate> estimates);
  // A peer's vector. Throws ProtocolError for a round out of sequence or a duplicate.
  void receive(int peer, RoundMessage msg);
  // Rank 0: the tag for a ResponseList sent now.
  uint64_t tag() const { return opt_.enabled ? started_ : 0; }
  // A list from rank 0 (rank 0's own too): executed by next() in its place.
  void hold(ResponseList list);
  // The next step to execute, or nullopt while waiting for vectors or lists.
  std::optional<RoundStep> next();

  // --- Timers.
  std::optional<Clock::time_point> next_wakeup(double timeout_s, double stall_check_s) const;
  // Ranks whose vector for the round in progress is still missing after timeout_s.
  std::vector<int> late_ranks(Clock::time_point now, double timeout_s) const;
  std::vector<RoundStall> check_stalls(Clock::time_point now, double stall_check_s);

  bool enabled() const { return opt_.enabled; }
  uint64_t completed() const { return completed_; }
  size_t pending_count() const { return pending_.size(); }

 private:
  struct Entry {
    std::string name;
    Request own;
    bool round_eligible = false;
    // From the response (identical on every rank): what fusion decisions read.
    int64_t count = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    double prescale = 1, postscale = 1;
  };
  struct Pending {
    Clock::time_point since;
    bool warned = false;
    std::vector<int> missing;  // from the last completed round
  };

  RoundOutcome complete_round();
  // `estimates`: the round's (rank 0's), which scale unfused_bytes the same way on every rank.
  std::vector<Response> fuse(const std::vector<int32_t>& ids,
                             const std::vector<multirail::RailEstimate>& estimates) const;

  CacheRoundsOptions opt_;
  std::map<int32_t, Entry> by_id_;
  std::unordered_map<std::string, int32_t> by_name_;
  std::map<int32_t, Pending> pending_;
  std::map<int32_t, uint32_t> invalidations_;  // id -> version, not yet announced
  // Per id, bumped whenever its metadata is (re)learned; never reset, so the same on every rank.
  // An announcement only erases the version it saw: if every rank re-submitted with the new
  // metadata, rank 0 may have re-cached it before the announcing round completes.
  std::unordered_map<int32_t, uint32_t> versions_;
  bool changed_ = false;             // something to announce since this rank's last vector
  uint32_t join_gen_ = 0;
  uint32_t joins_completed_ = 0;
  uint32_t all_joined_gen_ = 0;      // the join generation an all-joined round was seen for
  uint64_t started_ = 0, completed_ = 0;
  Clock::time_point round_started_at_;
  std::map<uint64_t, std::vector<std::optional<RoundMessage>>> inbox_;  // round -> by rank
  std::deque<ResponseList> held_;
};

}  // namespace nezha::engine
