// The workspace of one rank of a shm collective rail, in the data area of its segment: three step
// counters (each on its own cache line: each is written by the owner only and read by every peer),
// the rank a failure is blamed on, then one descriptor and one chunk buffer per slot.
//
// Steps. Every rank numbers the chunks it runs on the rail 0, 1, 2, ... from connect (all ranks run
// the same operations in the same order, so they agree); chunk g lives in slot g % slots. A counter
// holds "steps done": copied = g + 1 once chunk g's input is in the slot (and its descriptor written),
// reduced = g + 1 once this rank's slice of chunk g is reduced in place, consumed = g + 1 once this
// rank has read everything it needs of chunk g from every workspace. (Broadcast, allgather and
// reducescatter leave `reduced` alone: they place and read, shm_coll_pipeline.h.) A rank writes slot s for step g
// only when every rank's consumed >= g + 1 - slots (nobody still reads what was there).
// The owner writes a descriptor before its store of copied; peers read it after loading copied, so
// the plain fields are ordered by the counter. Counters are stored and loaded seq_cst: the sleep
// protocol (shm_ring.h) needs a publisher's counter store ordered before its load of the waiter's
// `sleeping` flag, or a wake-up is lost and the waiter sleeps a whole liveness slice.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace nezha::transport::shm_coll {

struct alignas(64) StepCounter {
  std::atomic<uint64_t> steps{0};
};

struct alignas(64) SlotDescriptor {  // what the chunk in a slot belongs to (a mismatch is a protocol error)
  uint64_t step;
  uint64_t seq;     // the operation number on the rail
  uint64_t count;   // elements (allreduce, reducescatter) or bytes (broadcast, allgather) of the whole operation
  uint32_t dtype;
  uint32_t op;      // ReduceOp; 0 where nothing is reduced
  uint32_t kind;    // transport::CollectiveOp
  int32_t root;     // a broadcast's; -1 otherwise
  uint64_t layout;  // a digest of the per-rank sizes (allgather, reducescatter); 0 otherwise
};

// FNV-1a over per-rank sizes: ranks that disagree on any of them disagree here.
template <class Sizes>
uint64_t layout_digest(const Sizes& sizes) {
  uint64_t h = 1469598103934665603ull;
  for (auto v : sizes) {
    uint64_t x = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i, x >>= 8) h = (h ^ (x & 0xff)) * 1099511628211ull;
  }
  return h;
}

struct alignas(64) WorkspaceControl {
  StepCounter copied, reduced, consumed;
  alignas(64) std::atomic<int32_t> blame{-1};  // rank this rank failed because of; -1: none
};

inline size_t round_up_64(size_t v) { return (v + 63) / 64 * 64; }

inline size_t workspace_bytes(size_t chunk_bytes, uint32_t slots) {
  return sizeof(WorkspaceControl) + slots * sizeof(SlotDescriptor) + slots * round_up_64(chunk_bytes);
}

// One rank's workspace as this process maps it.
struct Workspace {
  WorkspaceControl* control = nullptr;
  SlotDescriptor* descriptors = nullptr;
  uint8_t* data = nullptr;
  size_t slot_stride = 0;
  uint32_t slots = 0;

  // base: the segment's data area (fresh segments are zero-filled: every counter 0). The caller
  // constructs the control block of its own workspace only (placement new), never a peer's.
  static Workspace at(uint8_t* base, size_t chunk_bytes, uint32_t slots) {
    Workspace w;
    w.control = reinterpret_cast<WorkspaceControl*>(base);
    w.descriptors = reinterpret_cast<SlotDescriptor*>(base + sizeof(WorkspaceControl));
    w.data = base + sizeof(WorkspaceControl) + slots * sizeof(SlotDescriptor);
    w.slot_stride = round_up_64(chunk_bytes);
    w.slots = slots;
    return w;
  }
  uint8_t* slot(uint64_t step) const { return data + (step % slots) * slot_stride; }
  SlotDescriptor& descriptor(uint64_t step) const { return descriptors[step % slots]; }
};

}  // namespace nezha::transport::shm_coll
