// CollectiveRail: a rail that runs a collective itself (in-network aggregation, shared memory reducing
// straight from peers' buffers), the second kind derived from Rail (rail.h) beside the
// point-to-point rail the ring and log-step algorithms run on. Modelled on NCCL's CollNet
// (reduceSupport(dtype, op), iallreduce + test; from v7 iallgather and ireducescatter): an
// aggregation daemon (transport/agg/) implements the allreduce in software; a SHARP backend over
// libsharp_coll would implement it on switch ASICs the same way (reduces() from sharp_coll_caps,
// start_allreduce() = sharp_coll_do_allreduce_nb, test/wait = sharp_coll_req_test/req_wait; lifecycle
// as every Rail's: the opaque address, connect, reset, close, abort).
//
// Operations. Every collective rail runs allreduces. Broadcast, allgather, reducescatter and alltoall
// are optional: runs(op) says which a rail has, and only those are ever started on it (the shared-memory
// rail runs them all; an aggregator reduces and forwards nothing else). The start_* of an operation a
// rail does not run throws InvalidArgument; nothing calls it (NCCL leaves such a CollNet entry
// null).
//
// How the engine holds it. As a Rail, like every rail; Rail::as_collective() answers with this
// interface. It carries no messages between ranks, so it is never handed to a collective algorithm
// (they take a PointToPointRail): the executor runs an allreduce share on it when takes(dtype, op,
// bytes), and a broadcast, allgather, reducescatter or alltoall of every rank whole on it when it
// runs that operation; the rail table gives it nothing else (multirail::RailDescription::reduces and
// runs).
//
// What it promises, for every operation.
//  * The result lands in the output on every rank, bit-identical on all ranks (the reducer sums in
//    rank order: an allreduce's elements, and a reducescatter's block r on rank r, equal the serial
//    rank-order reduction).
//  * Every rank of the job starts the same operations in the same order with the same sizes (count,
//    per-rank counts, root), dtype and op, identified by `seq` (the operation's number on the rail).
//    A rank that starts anything else fails that operation on every rank with a ProtocolError naming
//    the ranks.
//  * wait() blocks until done, the deadline passes (TimeoutError naming the rank or daemon behind and
//    the rail), the aggregator or a peer fails (PeerError naming it), or abort() is called; it sleeps
//    while waiting. After a failure the rail stays poisoned until reset() + connect() (failover
//    re-admission).
//
// Threads. Data calls (start_*, test, wait) are made by the rail's worker only; properties,
// counters and abort are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/deadline.h"
#include "common/dtype.h"
#include "transport/rail.h"

namespace nezha::transport {

// The operations a collective rail may run.
enum class CollectiveOp : uint8_t { kAllreduce, kBroadcast, kAllgather, kReducescatter, kAlltoall };
const char* collective_op_name(CollectiveOp op);  // "allreduce", ...

// One operation in flight on a collective rail.
class CollectiveRequest {
 public:
  virtual ~CollectiveRequest() = default;
  // Makes what progress is possible without blocking; true once the result is in the output.
  // Throws as wait() does.
  virtual bool test() = 0;
  // Blocks until done; throws TimeoutError, PeerError, ProtocolError or NezhaError (aborted).
  virtual void wait(const Deadline& deadline) = 0;
};

class CollectiveRail : public Rail {
 public:
  CollectiveRail* as_collective() final { return this; }

  // Capability: true if this rail reduces `dtype` with `op` (kAverage: as kSum, the caller scales).
  virtual bool reduces(DataType dtype, ReduceOp op) const = 0;
  // Capability: whether this rail runs `op` at all (allreduce: every collective rail). A reducing
  // operation also needs reduces(dtype, op).
  virtual bool runs(CollectiveOp op) const { return op == CollectiveOp::kAllreduce; }
  // Whether an allreduce share of `bytes` of dtype/op can run here: reduced, and within
  // properties().max_share_bytes (0: no limit).
  bool takes(DataType dtype, ReduceOp op, size_t bytes) const {
    const size_t cap = properties().max_share_bytes;
    return reduces(dtype, op) && (cap == 0 || bytes <= cap);
  }
  // Called with (byte offset, bytes) of a range of the output before the rail first writes there,
  // when output aliases input: the engine keeps that part of the input for a redo. A rail whose result
  // arrives chunk by chunk calls it per chunk, so the copy is spread over the wait for the network
  // instead of delaying the start; one whose result lands in one piece calls it once for the whole.
  using OverwriteHook = std::function<void(size_t offset, size_t bytes)>;

  // Starts an allreduce; input and output must stay valid until the request is done or has thrown.
  // Throws InvalidArgument for a dtype/op the rail does not reduce.
  virtual std::unique_ptr<CollectiveRequest> start_allreduce(const void* input, void* output,
                                                              size_t count, DataType dtype,
                                                              ReduceOp op, uint64_t seq,
                                                              OverwriteHook before_overwrite = {}) = 0;

  // The optional operations (runs() says which); the start_* of one the rail does not run throws
  // InvalidArgument. Buffers must stay valid until the request is done or has thrown.
  //
  // Broadcast: `bytes` of `buf` on rank `root` land in `buf` on every rank.
  virtual std::unique_ptr<CollectiveRequest> start_broadcast(void* buf, size_t bytes, int root, uint64_t seq);
  // Allgather with per-rank sizes: rank r's bytes_per_rank[r] bytes (this rank's read from `input`)
  // land at output_blocks[r] on every rank. This rank's block may be `input` itself (then it is not
  // copied).
  virtual std::unique_ptr<CollectiveRequest> start_allgather(const void* input,
                                                              const std::vector<uint8_t*>& output_blocks,
                                                              const std::vector<size_t>& bytes_per_rank,
                                                              uint64_t seq);
  // Reducescatter with per-rank counts: block r (counts[r] elements, this rank's input of it at
  // input_blocks[r], never written) is reduced over the ranks, in rank order, into `output` on rank r.
  // `output` may be input_blocks[rank()] itself: each part of it is read before it is written.
  virtual std::unique_ptr<CollectiveRequest> start_reducescatter(const std::vector<const uint8_t*>& input_blocks,
                                                                  void* output, const std::vector<size_t>& counts,
                                                                  DataType dtype, ReduceOp op, uint64_t seq);
  // Alltoall: bytes_matrix (n x n, row-major, the same on every rank) says what each rank sends each
  // rank: rank i's send_blocks[j] (bytes_matrix[i * n + j] bytes) lands at recv_blocks[i] on rank j.
  virtual std::unique_ptr<CollectiveRequest> start_alltoall(const std::vector<const uint8_t*>& send_blocks,
                                                             const std::vector<uint8_t*>& recv_blocks,
                                                             const std::vector<size_t>& bytes_matrix, uint64_t seq);

 private:
  [[noreturn]] void refuse(CollectiveOp op) const;
};

}  // namespace nezha::transport
