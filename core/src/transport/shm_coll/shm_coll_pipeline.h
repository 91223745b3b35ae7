// Internal to the shm collective rail: what its operations share. The elementwise reduction in rank
// order, the wait for a rank behind (ShmCollRail::wait_until), and Pipeline, the chunk pipeline every
// operation runs on.
//
// Pipeline. An operation of `chunks` steps; step k is the rail's step base + k (all ranks agree,
// shm_coll_workspace.h). Phase one, place(k): this rank writes its part of chunk k into its own slot
// (possibly nothing: a broadcast's receivers) and its descriptor, then publishes copied; it may do so
// once every rank has consumed what the slot held `slots` steps before. An operation that works on
// the placed chunk before anyone takes from it (a large allreduce: each rank reduces its slice of
// the chunk in its own slot) has a middle phase, middle(k): once every rank has published copied,
// then publishes reduced. Last phase, take(k): once every rank has published copied (reduced, with
// a middle phase), this rank reads what it needs from the workspaces, then publishes consumed. The
// first phase that reads the peers' slots checks every descriptor first (a mismatch fails the
// operation on every rank: they all check). A rank places up to `slots` chunks ahead of what it has
// taken, so placing, reading and the peers' work overlap.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {

namespace shm_coll {

// dst[0, bytes) = srcs[0] (op) srcs[1] (op) ... each read at `offset`, in rank order, in blocks that
// stay in L1 between the ranks' passes: one pass over memory, the same bits on every rank. dst may
// be one of the sources.
void reduce_sources(uint8_t* dst, const std::vector<const uint8_t*>& srcs, size_t offset, size_t bytes,
                    size_t elem_size, DataType dtype, ReduceOp op, ReduceKernel kernel);

}  // namespace shm_coll

template <class Ready>
void ShmCollRail::wait_until(Ready ready, const char* const* phase, const Deadline& deadline) {
  using namespace std::chrono;
  const auto spin_end = Clock::now() + duration_cast<Clock::duration>(duration<double, std::micro>(config_.spin_us));
  while (Clock::now() < spin_end) {
    if (ready() < 0) return;
    if (aborted_) throw_if_unusable();
    shm::cpu_relax();
  }
  const long slice_us = static_cast<long>(config_.liveness_slice_ms * 1000);
  shm::SegmentHeader* me = own_.header();
  for (;;) {
    throw_if_unusable();
    // Dekker with the publishers (shm_ring.h): flag, doorbell, re-check, then sleep on that value.
    me->sleeping.store(1);
    const uint32_t bell = me->doorbell.load();
    const int lag = ready();
    if (lag < 0) {
      me->sleeping.store(0);
      return;
    }
    const long left_us = duration_cast<microseconds>(deadline.at() - Clock::now()).count();
    if (left_us > 0) shm::futex_wait(&me->doorbell, bell, std::min(slice_us, left_us));
    me->sleeping.store(0);
    const int behind = ready();
    if (behind < 0) return;
    check_peers(behind);
    if (deadline.expired())
      fail<TimeoutError>(lag, who() + ": timed out waiting for " + rank_name(lag) + " to " + *phase);
  }
}

class ShmCollRail::Pipeline : public CollectiveRequest {
 public:
  // An operation of per-rank (or per-pair) sizes: its count is their total, its layout their
  // digest (what every rank's descriptors must agree on); dtype and op left for reducing ones.
  static OpIdentity sized_identity(CollectiveOp kind, uint64_t seq, const std::vector<size_t>& sizes) {
    OpIdentity what;
    what.kind = kind;
    what.seq = seq;
    for (size_t s : sizes) what.count += s;
    what.op = static_cast<ReduceOp>(0);
    what.layout = shm_coll::layout_digest(sizes);
    return what;
  }

  bool test() final { return progress(nullptr); }
  void wait(const Deadline& deadline) final { progress(&deadline); }

 protected:
  // Takes the rail's next `chunks` steps.
  Pipeline(ShmCollRail& rail, const OpIdentity& what, uint64_t chunks, bool has_middle = false);

  // This rank's part of chunk k into `slot` (its own workspace's slot of the step); returns the bytes
  // written.
  virtual size_t place(uint64_t k, uint8_t* slot) = 0;
  // What this rank needs of chunk k, read from the workspaces (slot(r): rank r's slot of the step);
  // returns the bytes read.
  virtual size_t take(uint64_t k) = 0;
  // With a middle phase: this rank's work on chunk k in the workspaces between place and take.
  virtual void middle(uint64_t /*k*/) {}

  int rank() const { return rail_.rank_; }
  int ranks() const { return rail_.size_; }
  const ShmCollRailConfig& config() const { return rail_.config_; }
  uint8_t* slot(int r, uint64_t k) const { return rail_.peers_[r].ws.slot(base_ + k); }
  // f(at, len) over [0, bytes) in cache lines, on the rail's helper threads where it has them
  // (shm_coll_crew.h), else on this thread.
  template <class F>
  void split(size_t bytes, F&& f) const {
    if (shm_coll::Crew* crew = rail_.crew_.get()) crew->split(bytes, 64, f);
    else if (bytes > 0) f(size_t{0}, bytes);
  }
  void copy(uint8_t* dst, const uint8_t* src, size_t bytes) const {
    split(bytes, [&](size_t at, size_t len) { std::memcpy(dst + at, src + at, len); });
  }

 private:
  bool progress(const Deadline* deadline);
  int place_blocker() const;  // -1: ready; -2: nothing left to place; else the rank behind
  int middle_blocker() const;
  int take_blocker() const;
  // The first rank whose `counter` is below `steps`; -1 if none.
  int behind(shm_coll::StepCounter shm_coll::WorkspaceControl::*counter, uint64_t steps) const;
  int blocker();
  bool done() const { return next_take_ == chunks_; }

  ShmCollRail& rail_;
  const OpIdentity what_;
  const uint64_t chunks_;
  const uint64_t base_;
  const bool has_middle_;
  uint64_t next_place_ = 0, next_middle_ = 0, next_take_ = 0;
  const char* phase_ = "";
};

}  // namespace nezha::transport
