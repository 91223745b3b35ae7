// Host votes: small allreduces of a one-host job agreed and exchanged on the host board
// (host_vote_board.h) instead of through rank 0.
//
// Which tensors. A slot is given to a tensor the second time a response from rank 0 that caches it
// is executed (negotiator_execute.cc; a name used once, as torch.distributed's numbered operations
// are, never takes one): an allreduce of the global set whose inputs fit a board area, while slots
// are left and rank 0 marked the board ready. It keeps the slot; its instances vote while their
// inputs fit. Responses run in the same order on every rank, so
// every rank gives the same slot to the same name (a name keeps its slot; the response cache never
// gives a name's id to another). Rank 0 marks the board ready before it answers anything, and only
// where every rank is on its shared-memory control path, has votes on (NEZHA_HOST_VOTE) and cache
// rounds off, so whether slots exist at all is rank 0's decision, the same for everyone.
//
// Every instance of a slotted tensor counts in on its slot on every rank, which keeps the ranks'
// vote numbers for it equal: a synchronous caller with that one tensor and the cached metadata
// votes (its input on the board, waits, reduces); any other submission of it (asynchronous, in a
// group, other metadata, a device buffer) counts in "diverted" at once and goes to rank 0 as
// before, and the voters, seeing the mark once everyone is in, follow it there. A join() breaks the
// board for good before it is queued (a joined rank submits nothing, so a vote would wait on it;
// negotiation knows how to count it in), as does an engine failure or shutdown; voters that see the
// break before their vote completed go to rank 0 too, and the board's word decides for all of them
// alike which votes completed.
//
// Threads: learn() on the loop's thread; plan() and commit() on submitting threads; one mutex.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/negotiation/host_vote_board.h"
#include "engine/request.h"
#include "engine/tensor_entry.h"

namespace nezha::engine {

class HostVote {
 public:
  // size: the job's ranks (Average's 1/size); the board knows this rank.
  HostVote(HostVoteBoard board, int size) : board_(board), size_(size) {}

  // A response that caches names[index] under a cache id ran on this rank (`own`: its request).
  void learn(const Request& own, const Response& resp, size_t index);

  // What one entry of a submission does on the board.
  struct Step {
    enum class Kind { kNone, kVote, kDivert } kind = Kind::kNone;
    uint32_t slot = 0;
    uint64_t seq = 0;  // set by commit()
    // The cached operation (kVote): what the result is computed with.
    int64_t count = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    double prescale = 1, postscale = 1;
  };
  // Pure: what each of `entries` would do (kVote only for a lone entry of a caller that waits).
  std::vector<Step> plan(const std::vector<TensorEntry>& entries, bool lone_waiting_caller) const;
  // The entries were queued: takes each step's vote number. Then the caller must arrive() each.
  void commit(std::vector<Step>& steps);

  HostVoteBoard& board() { return board_; }

 private:
  static constexpr uint32_t kNoSlot = ~0u;
  struct Slotted {
    uint32_t slot = kNoSlot;
    bool votes = false;  // the cached metadata fits a vote (otherwise every instance diverts)
    Request own;
    int64_t count = 0;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    double prescale = 1, postscale = 1;
  };

  HostVoteBoard board_;
  const int size_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slotted> by_name_;
  std::vector<uint64_t> next_seq_ = std::vector<uint64_t>(HostVoteBoard::kSlots, 0);
  uint32_t slots_used_ = 0;
};

}  // namespace nezha::engine
