// CollectiveRail: a rail that reduces a share itself (in-network aggregation, shared memory reducing
// straight from peers' buffers), the second kind derived from Rail (rail.h) beside the
// point-to-point rail the ring and log-step algorithms run on. Modelled on NCCL's CollNet
// (reduceSupport(dtype, op), iallreduce + test): an aggregation daemon (transport/agg/) implements it
// in software; a SHARP backend over libsharp_coll would implement it on switch ASICs the same way
// (reduces() from sharp_coll_caps, start_allreduce() = sharp_coll_do_allreduce_nb, test/wait =
// sharp_coll_req_test/req_wait; lifecycle as every Rail's: the opaque address, connect, reset, close,
// abort).
//
// How the engine holds it. As a Rail, like every rail; Rail::as_collective() answers with this
// interface. It carries no messages between ranks, so it is never handed to a collective algorithm
// (they take a PointToPointRail): the executor runs an allreduce share on it when takes(dtype, op,
// bytes), and the rail table never gives it an operation that is not an allreduce it reduces
// (multirail::RailDescription::reduces).
//
// What it promises.
//  * An allreduce of `count` elements of `input` lands in `output` (may equal input) on every rank,
//    bit-identical on all ranks (the reducer sums in rank order).
//  * Every rank of the job starts the same allreduces in the same order with the same count, dtype
//    and op, identified by `seq` (the share's operation number on the rail). A rank that starts a
//    different count/dtype/op fails that allreduce on every rank with a ProtocolError naming the ranks.
//  * wait() blocks until done, the deadline passes (TimeoutError naming the daemon and rail), the
//    aggregator or a peer fails (PeerError), or abort() is called; it sleeps in poll while waiting.
//    After a failure the rail stays poisoned until reset() + connect() (failover re-admission).
//
// Threads. Data calls (start_allreduce, test, wait) are made by the rail's worker only; properties,
// counters and abort are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/deadline.h"
#include "common/dtype.h"
#include "transport/rail.h"

namespace nezha::transport {

// One allreduce in flight on a collective rail.
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
};

}  // namespace nezha::transport
