// Engine: the host board (negotiation/host_vote.h) set up after connect, and a synchronous caller
// voting on it.

#include <sched.h>

#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/negotiation/control_inline.h"

namespace nezha::engine {

using namespace internal;

namespace {
// How long a voter sleeps on the board between looks at the engine (a failure completes its
// handle: a rank killed mid-vote is named here within this).
constexpr double kVoteSliceS = 0.05;
}  // namespace

void Engine::set_up_host_vote() {
  bool everyone = false;
  const transport::MessagePath::HostBoard b = control_->host_board(&everyone);
  if (b.base == nullptr) return;
  HostVoteBoard board(b.base, b.bytes, config_.rank, config_.size);
  // Rank 0 decides for the job, before it answers any request: a worker learns slots only from
  // responses, so it sees this flag as rank 0 left it.
  if (config_.rank == 0 && everyone && config_.host_vote && !config_.cache_rounds) board.set_ready();
  host_vote_ = std::make_unique<HostVote>(board, config_.size);
}

bool Engine::run_host_vote(const HostVote::Step& step, const std::shared_ptr<OpHandle>& handle,
                           const std::string& name, const void* input) {
  HostVoteBoard& board = host_vote_->board();
  const size_t bytes = static_cast<size_t>(step.count) * dtype_size(step.dtype);
  HostVoteBoard::State st = board.arrive(step.slot, step.seq, input, bytes, /*divert=*/false);
  const Clock::time_point started = Clock::now();
  // The others usually come within tens of microseconds. Yielding meanwhile hands this core to
  // whichever rank is runnable on it (with more ranks than cores, often one still to vote) and
  // costs no wake-up; a sleep on the futex costs the last one in a wake-up call and this rank a
  // wake-up (4 ranks on 2 cores, 8 bytes: 70 -> 21 us a call; benchmarks/SHM.md).
  if (st == HostVoteBoard::State::kPending && config_.host_vote_spin_us > 0) {
    const Clock::time_point until = started + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double, std::micro>(config_.host_vote_spin_us));
    do {
      ::sched_yield();
      st = board.state(step.slot, step.seq);
    } while (st == HostVoteBoard::State::kPending && Clock::now() < until);
  }
  while (st == HostVoteBoard::State::kPending) {
    st = board.wait(step.slot, step.seq, kVoteSliceS);
    if (st != HostVoteBoard::State::kPending) break;
    if (handle->poll()) return true;  // the engine failed meanwhile: the handle says why
    const double waited = std::chrono::duration<double>(Clock::now() - started).count();
    if (config_.stall_check_s > 0 && waited >= config_.stall_check_s) {
      // As long a wait as negotiation's stall check: hand it to negotiation, which names the ranks
      // and applies the stall settings. The board stays broken for the rest of the job.
      std::string missing;
      for (int r : board.missing(step.slot, step.seq)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      NZ_LOG(Warning) << rank_prefix(config_.rank) << "tensor '" << name << "': rank(s) " << missing
                      << " have not submitted it after " << waited
                      << " s; the host board stops and negotiation through rank 0 takes over";
      board.break_all();
    }
  }
  if (st == HostVoteBoard::State::kComplete && !board.any_diverted(step.slot, step.seq)) {
    std::vector<const void*> inputs(static_cast<size_t>(config_.size));
    std::string bad;  // only if the ranks' vote numbers parted: a bug, named rather than reduced
    for (int r = 0; r < config_.size && bad.empty(); ++r) {
      size_t got = 0;
      inputs[static_cast<size_t>(r)] = board.input(step.slot, step.seq, r, &got);
      if (inputs[static_cast<size_t>(r)] == nullptr || got != bytes)
        bad = "tensor '" + name + "': rank " + std::to_string(r) + " has no input of " + std::to_string(bytes) +
              " bytes for host vote " + std::to_string(step.seq) + " of slot " + std::to_string(step.slot);
    }
    // Out of flight first: its entry keeps the caller's buffers alive while the result goes in.
    Submissions::Taken taken = submissions_.take({name}, [](size_t, const TensorEntry&) {});
    if (!taken.present[0]) return true;  // failed meanwhile (fail_all completed the handle)
    TensorEntry& e = taken.entries[0];
    if (!bad.empty()) {
      NZ_LOG(Error) << rank_prefix(config_.rank) << bad;
      board.break_all();
      e.handle->complete(bad);
      return true;
    }
    reduce_in_rank_order(inputs, step.count, step.dtype, step.op, step.prescale, step.postscale, e.output);
    timeline_.negotiation_finished(name);
    timeline_.done_by_coordinator(name, bytes, "every rank");
    ++tensors_by_host_vote_;
    e.handle->complete();
    return true;
  }
  ++host_votes_diverted_;
  submissions_.requeue({name});
  return false;
}

}  // namespace nezha::engine
