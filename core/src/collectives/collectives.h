// Collective algorithms over one point-to-point rail (transport/rail.h), and the operations of a
// collective rail (transport/collective_rail.h), which runs them itself. The engine calls
// these from a rail's worker thread, with the part of a (fused) buffer assigned to that rail. Every
// rank calls the same function with the same sizes, seq and options in the same order; tags are
// derived from seq so a desynchronised peer is caught as a ProtocolError instead of corrupting data.
//
// Results are bit-identical on every rank: each output element is computed once, by one rank, and
// copied to the others (ring), or computed by both partners from the same two operands in a
// canonical order (log-step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/deadline.h"
#include "common/dtype.h"
#include "transport/collective_rail.h"
#include "transport/host_lane.h"
#include "transport/rail.h"

namespace nezha::collectives {

struct CollectiveOptions {
  uint64_t seq = 0;               // operation sequence number on this rail; identical on all ranks
  Deadline deadline = Deadline::never();
  size_t segment_bytes = 1 << 20; // ring pipeline segment (tests set it small to reach multi-segment paths)
  size_t logstep_max_bytes = 65536;  // allreduce(): payloads up to this use the log-step algorithm
  size_t halving_max_bytes = 0;      // allreduce(): larger ones up to this halving/doubling, the ring above
                                     // (the engine passes NEZHA_HALVING_MAX_BYTES; 0 here: no halving)
  // allreduce only, may be empty: called with a byte range of the output before the algorithm first
  // writes there anything but that range's input (ranges may repeat; together they cover every such
  // byte). In place, the engine keeps the input for a redo on another rail this way, a range at a
  // time while the data moves, instead of copying the whole input before the operation starts. Out
  // of place the input stays where it is, but the engine may hand it back (the operation done) before
  // a redo: it saves the same ranges from the input. The ring, halving and log-step report every byte of
  // the output when the rail has several ranks.
  std::function<void(size_t offset, size_t bytes)> before_overwrite;
  // allreduce only: every element of the result is multiplied by this exactly once (scale(): Average's
  // 1/size, a user's postscale). The ring scales each block where it is completed, so a rank scales
  // 1/size of the data, still in cache, instead of all of it afterwards; every rank gets the same bits.
  double postscale = 1.0;
};

// Tag for step `step` of operation `seq`; steps are < 2^20.
inline uint64_t make_tag(uint64_t seq, uint64_t step) { return (seq << 20) | (step & 0xFFFFF); }

// Allreduce of count elements of `in` into `out`: in place where they are the same buffer, else they
// must not overlap and `in` is never written. Chooses log-step for small payloads (up to
// opt.logstep_max_bytes), halving/doubling for mid-size ones (up to opt.halving_max_bytes), the ring
// above.
// Out of place, the ring and halving read `in` where it needs it and writes each byte of `out` once it has its
// sum: no copy of `in` into `out` first, which would hold back every rank's first message for the
// copy and a fresh output's page faults (27-97 ms of a 64 MB allreduce into XLA's output). The
// others (small payloads, a collective rail's allreduce below) copy first.
void allreduce(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
               const CollectiveOptions& opt);
inline void allreduce(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
                      const CollectiveOptions& opt) {
  allreduce(rail, buf, buf, count, dtype, op, opt);
}
// On a collective rail: the rail reduces the share (out of place, `in` is copied to `out` first),
// then opt.postscale applies; before_overwrite hears of the ranges the rail writes. Throws
// InvalidArgument naming the rail when it does not take this dtype, op and size.
void allreduce(transport::CollectiveRail& rail, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, const CollectiveOptions& opt);
// Pipelined ring: reduce-scatter then allgather, segmented by opt.segment_bytes; in place or out of
// place as allreduce().
void allreduce_ring(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype,
                    ReduceOp op, const CollectiveOptions& opt);
inline void allreduce_ring(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
                           const CollectiveOptions& opt) {
  allreduce_ring(rail, buf, buf, count, dtype, op, opt);
}
// Recursive doubling (non-powers of two fold the extra ranks in first and out last).
void allreduce_logstep(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
                       const CollectiveOptions& opt);
// Rabenseifner: recursive-halving reduce-scatter, then recursive-doubling allgather (2 log2(p) steps,
// the ring's bytes; the same fold as the log-step); segmented by opt.segment_bytes; in place or out
// of place as allreduce(), without a copy of `in` first.
void allreduce_halving(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype,
                       ReduceOp op, const CollectiveOptions& opt);
inline void allreduce_halving(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
                              const CollectiveOptions& opt) {
  allreduce_halving(rail, buf, buf, count, dtype, op, opt);
}

// Hierarchical allreduce (design: hierarchy.h): reduce-scatter among the ranks of each host over
// host_lane (a kHost rail), allreduce of each slice across hosts among its owners over network, then
// allgather over host_lane. The network rail in job rank space; the lane point to point in job rank
// space too, or a collective rail of this host's ranks (in job rank order), which runs the two host
// phases itself; placement the same on every rank.
void allreduce_hierarchical(transport::Rail& host_lane, transport::PointToPointRail& network,
                            const transport::HostPlacement& placement, void* buf, size_t count, DataType dtype,
                            ReduceOp op, const CollectiveOptions& opt);

// out = concatenation over ranks r of bytes_per_rank[r] bytes; this rank's block is read from `in`
// (which may alias its slot in out).
void allgatherv(transport::PointToPointRail& rail, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank, const CollectiveOptions& opt);

// Scattered-block forms of allgatherv, alltoallv and reducescatterv: block i (of rank i, or for or
// from rank i) at its own address instead of consecutive in one buffer. A share of a striped
// operation carries a part of every block, spread out in the whole operation's buffers; these let
// it read and write those parts where they are (no packing into a buffer per rail and unpacking).
// Messages and results are those of the contiguous forms.

// out_blocks[i] receives rank i's bytes_per_rank[i] bytes; this rank's are copied from `in`.
void allgatherv_blocks(transport::PointToPointRail& rail, const void* in, const std::vector<uint8_t*>& out_blocks,
                       const std::vector<size_t>& bytes_per_rank, const CollectiveOptions& opt);

// An alltoallv message of this many bytes or more is acknowledged by its receiver, and its sender
// waits for that before its next step (alltoall.cc says why). A caller that splits an alltoall
// (a balanced striped one) keeps its pieces at least this large per peer so they stay paced.
constexpr size_t kAlltoallPacedBytes = 256 << 10;

// send_bytes[i] bytes at send_blocks[i] go to rank i; recv_bytes[i] bytes from rank i land at
// recv_blocks[i].
void alltoallv_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& send_blocks,
                      const std::vector<size_t>& send_bytes, const std::vector<uint8_t*>& recv_blocks,
                      const std::vector<size_t>& recv_bytes, const CollectiveOptions& opt);

// This rank's input of block i (counts[i] elements) is read at in_blocks[i] and never written.
// work_blocks[i] receives partial sums (scratch the caller provides; it may be in_blocks[i]);
// work_blocks[rank] ends holding the reduction of block `rank`. No copy of the input is made.
void reducescatterv_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& in_blocks,
                           const std::vector<uint8_t*>& work_blocks, const std::vector<size_t>& counts,
                           DataType dtype, ReduceOp op, const CollectiveOptions& opt);

// buf (bytes long) is copied from root to every rank: a binomial tree below
// kBroadcastChainMinBytes (log2 n steps), a pipelined chain from there on (every rank sends the
// data once, so the root's link carries it once instead of log2 n times). The tree saves hops, which
// only pays while a hop costs more than the bytes: on a network rail that stops being true at tens
// of kilobytes. Within a host (a kHost rail: shared memory) bytes move at memory speed and a hop, a
// thread wake-up, is worth far more bytes: there the tree goes up to kBroadcastChainMinBytesInHost
// and the chain's pieces stay large (smaller ones gain nothing measurable there).
constexpr size_t kBroadcastChainMinBytes = 64 << 10;
constexpr size_t kBroadcastChainMinBytesInHost = 256 << 10;
void broadcast(transport::PointToPointRail& rail, void* buf, size_t bytes, int root,
               const CollectiveOptions& opt);

// The same operations on a collective rail that runs them (CollectiveRail::runs; the rail does the
// whole operation itself, in rank order where it reduces): same arguments and results as the
// point-to-point forms, except that a reducescatter's work_blocks other than this rank's are left
// untouched. Each throws InvalidArgument naming the rail when it does not run the operation (or
// reduce dtype/op).
void broadcast(transport::CollectiveRail& rail, void* buf, size_t bytes, int root, const CollectiveOptions& opt);
void allgatherv(transport::CollectiveRail& rail, const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                const CollectiveOptions& opt);
void reducescatterv_blocks(transport::CollectiveRail& rail, const std::vector<const uint8_t*>& in_blocks,
                           const std::vector<uint8_t*>& work_blocks, const std::vector<size_t>& counts,
                           DataType dtype, ReduceOp op, const CollectiveOptions& opt);
// Alltoall with the whole byte matrix (n x n, row i: what rank i sends each rank; the same on every
// rank): this rank's row says what leaves `in` (blocks in rank order), its column what lands in `out`.
void alltoallv(transport::CollectiveRail& rail, const void* in, void* out, const std::vector<size_t>& bytes_matrix,
               const CollectiveOptions& opt);

// send_bytes[r] bytes from `in` (blocks in rank order) go to rank r; recv_bytes[r] bytes from rank r
// land in `out` (blocks in rank order). Pairwise exchange.
void alltoallv(transport::PointToPointRail& rail, const void* in, const std::vector<size_t>& send_bytes,
               void* out, const std::vector<size_t>& recv_bytes, const CollectiveOptions& opt);

// `in` holds sum(counts) elements; rank r receives the reduction of block r (counts[r] elements)
// into `out`. `in` is used as scratch and is clobbered.
void reducescatterv(transport::PointToPointRail& rail, void* in, void* out, const std::vector<size_t>& counts,
                    DataType dtype, ReduceOp op, const CollectiveOptions& opt);

}  // namespace nezha::collectives
