// One job on nezha-aggd: its slots and their sums, without any I/O (the daemon feeds it frames).
//
// A job is (id, epoch): every rank of it joined with the same id, size, window and chunk size. Each
// allreduce chunk (seq, chunk) gets a slot when its first contribution arrives; the slot keeps every
// rank's bytes and, once all ranks have sent theirs, sums them in rank order (so the result is the same
// whichever rank arrived first, and identical for every receiver) into one result frame that all
// ranks are sent. Because each rank has at most `window` chunks unanswered and ranks send chunks in the
// same order, at most `window` slots are open at once: a job's memory is bounded by its reservation
// (reserved_bytes()), whatever it sends; anything beyond is an error of that job.
//
// Retransmission is idempotent: a contribution a slot already has is ignored, and one for a chunk
// completed recently (the last `window` results are kept) gets that result again (a rank that
// reconnected resends what was unanswered).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/agg/agg_protocol.h"

namespace nezha::aggd {

using transport::agg::AggHeader;
using transport::agg::AggJoin;

class AggJob {
 public:
  AggJob(uint64_t id, uint64_t epoch, const AggJoin& shape);

  uint64_t id() const { return id_; }
  uint64_t epoch() const { return epoch_; }
  const AggJoin& shape() const { return shape_; }
  // The most this job can hold at once: open slots, kept results.
  static size_t reserved_bytes(const AggJoin& shape);

  enum class Outcome {
    kPending,    // the slot waits for other ranks (or already had this rank's bytes)
    kCompleted,  // `result` goes to every rank
    kResend,     // a retransmission of a recently completed chunk: `result` goes to this rank again
    kStale,      // a retransmission of a chunk completed long ago: nothing to answer
  };
  struct Contribution {
    Outcome outcome = Outcome::kPending;
    std::shared_ptr<const std::string> result;  // the result frame, shared by every rank's send queue
  };
  // One rank's chunk (header already decoded). Throws ProtocolError naming the ranks for a malformed
  // chunk, a rank whose count, dtype or op differs from the first contributor's, or more than
  // `window` open slots.
  Contribution contribute(const AggHeader& h, const uint8_t* payload);

  size_t open_slots() const { return slots_.size(); }

 private:
  struct Slot {
    AggHeader first;        // the first contribution's header (the shape every rank must match)
    std::vector<std::string> parts;  // per rank; empty until it arrives
    uint32_t have = 0;
  };
  using Key = std::pair<uint64_t, uint32_t>;  // (seq, chunk)
  std::shared_ptr<const std::string> finish(const Key& key, Slot& slot);

  uint64_t id_, epoch_;
  AggJoin shape_;
  std::map<Key, Slot> slots_;
  std::deque<std::pair<Key, std::shared_ptr<const std::string>>> kept_;  // last `window` results
  Key completed_upto_{0, 0};  // every key below this has completed (chunks complete in order)
  bool any_completed_ = false;
};

}  // namespace nezha::aggd
