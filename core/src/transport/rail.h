// The rail contract: one network plane joining this rank to every other rank of the job.
//
// What it is for. The engine stripes every collective across all rails a job has (a kHost rail, such
// as shared memory, joins only the ranks of one host: see RailReach); each rail runs its share of
// the work on its own worker thread, over its own connections, so rails never wait on each other.
//
// Three levels, as NCCL splits ncclNet from ncclCollNet:
//  * Rail (this file): what every rail has. Properties, lifecycle (opaque local address, connect,
//    reset, close), counters, abort, link fault. The engine holds every rail as a Rail and asks it
//    one question about its kind: as_point_to_point() or as_collective(); exactly one answers.
//  * PointToPointRail (this file): messages between ranks (send, recv, sendrecv). The collective
//    algorithms (core/src/collectives/) take only this type, so a rail that cannot carry messages
//    cannot be handed to them.
//  * CollectiveRail (collective_rail.h): runs a collective itself (in-network aggregation, shared
//    memory reducing from peers' buffers). It says which dtypes/ops it reduces, how large a share
//    may be and which operations besides allreduce it runs, and runs each as start / test / wait.
//    It has no data calls to peers.
//
// What a point-to-point rail promises.
//  * Message oriented: a send of N bytes with tag T to peer P is received by exactly one
//    recv(P', T, N) on P, in order per (sender, receiver) pair. The receiver always knows the exact
//    size and tag it expects (the algorithms are deterministic); any other frame is rejected with
//    ProtocolError naming the peer and rail. Nothing is silently dropped or truncated.
//  * send/recv/sendrecv block until complete, the deadline passes (TimeoutError naming peer and
//    rail), the peer fails (PeerError), or abort() is called (NezhaError with the abort reason).
//    A rail never busy-polls: it sleeps in poll() (or the transport's equivalent) while waiting.
//  * sendrecv progresses its send and its receive together, so two ranks exchanging large
//    messages with each other (or around a ring) cannot deadlock on full socket buffers.
//  * Data moves straight from/to the caller's buffers where the transport allows (no staging copy).
//
// Threads. Data calls (send, recv, sendrecv; a collective rail's start/test/wait) are made by one
// thread at a time: the rail's worker. properties(), counters(), reaches(), link_fault(),
// delivering() and abort() are thread-safe and may be called from any thread.
//
// Kinds. A transport is a folder under core/src/transport/ plus one row in rail_kinds.cc; the
// engine builds rails with make_rail() (rail_factory.h) and never names a concrete transport.
//
// Failures. After a PeerError or ProtocolError on a peer, that peer's connection on this rail is
// closed; later calls to that peer throw PeerError at once. abort() poisons the whole rail: every
// pending and future data call throws. Errors never escape as crashes; the engine decides whether the
// job can go on (another rail) or must fail (every rail to a peer lost).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace nezha::transport {

// Which ranks a rail connects. kJob: every rank of the job. kHost: only the ranks on this rank's host
// (shared memory); the others are unreachable on it (PointToPointRail::reaches() says which).
enum class RailReach { kJob, kHost };

// What the scheduler may read about a rail. It never asks "what type are you": capabilities only
// (whether a rail carries messages or reduces itself is its kind: Rail::as_point_to_point()).
struct RailProperties {
  std::string name;          // as the user named it: "eth1", "10.50.0.0/24", "shm"
  std::string kind;          // the kind table's name ("tcp", "shm", ...); shown in rail_stats()
  std::string local_addr;    // human-readable, for rail_stats(): "10.0.0.1", "shm:<host>"
  std::string bind_ip;       // IPv4 address the rail's traffic leaves from, if it has one ("10.0.0.1";
                             // empty for shm): the engine opens this rail's control path there
  RailReach reach = RailReach::kJob;
  double latency_us_prior = 0;   // priors the cost model starts from before any measurement (0 = unknown)
  double gbps_prior = 0;         // link speed if the transport knows it (0 = unknown)
  size_t max_share_bytes = 0;    // largest share one operation may give this rail; 0 = no limit
  bool needs_registered_memory = false;  // data calls need buffers registered with the rail (RDMA)
  // Moves its data through this host's memory with this host's CPUs (shared memory, TCP over
  // loopback): such rails draw on one resource, so striping one operation over several of them adds
  // no bandwidth. The rail table never stripes a collective rail of this kind with another one.
  bool host_memory = false;
  // Whether the rail can fail while every rank it joins lives on (a cut cable, a closed socket, a
  // daemon gone). False where its data path is this host's shared memory only: there is no link to
  // cut, so it fails only when a rank does, and every other rail of the job fails with that rank.
  // A failover redo can never save such a rail's share, so no input is kept for it.
  bool can_fail_alone = true;
};

struct RailCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class PointToPointRail;
class CollectiveRail;  // collective_rail.h
class HostLane;        // host_lane.h

// What every rail has.
class Rail {
 public:
  virtual ~Rail() = default;

  virtual const RailProperties& properties() const = 0;
  virtual int rank() const = 0;  // in the job's rank space, always (also for kHost rails)
  virtual int size() const = 0;

  // Lifecycle.
  // local_address(): opaque bytes the peers need to reach this rank on this rail; exchanged through
  //   the rendezvous as they are (they may contain any byte, NUL included).
  // connect(): forms the rail from every rank's local_address() (index = rank). A kHost rail connects
  //   only to the ranks whose address says "same host" and treats the others as unreachable. Throws
  //   NezhaError naming the ranks still missing when the deadline passes.
  // reset(): drops every connection and clears abort(), so that a later connect() re-forms the rail
  //   (failover re-admission; every rank resets before any rank connects).
  // close(): idempotent, also run by the destructor.
  // reset/close/connect must not race a data call (abort() is the way to stop one).
  virtual std::string local_address() const = 0;
  virtual void connect(const std::vector<std::string>& addresses_by_rank,
                       const Deadline& deadline) = 0;
  virtual void reset() = 0;
  virtual void close() = 0;
  // kHost rails: which host a rank's local_address() belongs to, as opaque bytes equal for exactly
  // the ranks this rail joins (the hierarchical allreduce groups ranks by it on every rank alike).
  // Throws InvalidArgument for bytes that are not such an address. kJob rails: "" (one "host").
  virtual std::string host_key(const std::string& address) const { return {}; }

  virtual RailCounters counters() const = 0;
  virtual void abort(const std::string& reason) = 0;
  // Non-empty when this rank's own link of the rail is known to be gone (its interface lost its
  // carrier): a certain failure, unlike silence, which may be a late peer. "" when up or unknown.
  // Thread-safe and cheap: the watchdog asks a few times per silence limit while the rail works.
  virtual std::string link_fault() const { return {}; }
  // Whether the transport can vouch that every connection still delivers: nothing this rank sent
  // has waited `quiet` or longer for the peer's acknowledgement. A silent rail that delivers has a
  // late or busy peer (a starved CPU, a full receive window), not a broken path, and is not failed
  // over (failing it over would not help). false: some connection is stuck, or it cannot tell.
  virtual bool delivering(std::chrono::milliseconds quiet) const { return false; }

  // The rail's kind: PointToPointRail and CollectiveRail each answer theirs (final there), so a
  // rail answers exactly one; make_rail() refuses a rail that answers neither.
  virtual PointToPointRail* as_point_to_point() { return nullptr; }
  virtual CollectiveRail* as_collective() { return nullptr; }
};

// A rail that carries messages between ranks: what the ring, log-step and every other algorithm in
// core/src/collectives/ run on.
class PointToPointRail : public Rail {
 public:
  PointToPointRail* as_point_to_point() final { return this; }

  // After connect(): true if data calls to peer can work on this rail (false for itself, for a rank
  // a kHost rail does not reach, and for a peer whose connection was closed by an error).
  virtual bool reaches(int peer) const = 0;

  virtual void send(int peer, uint64_t tag, const void* data, size_t bytes,
                    const Deadline& deadline) = 0;
  virtual void recv(int peer, uint64_t tag, void* data, size_t bytes,
                    const Deadline& deadline) = 0;
  // Sends send_bytes to send_peer while receiving recv_bytes from recv_peer (may be the same peer),
  // both under the same tag. Either size may be zero (a zero-byte message is still exchanged).
  void sendrecv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                void* recv_data, size_t recv_bytes, uint64_t tag, const Deadline& deadline) {
    sendrecv_tags(send_peer, send_data, send_bytes, tag, recv_peer, recv_data, recv_bytes, tag,
                  deadline);
  }
  // sendrecv with a tag per direction: a pipelined algorithm sends its message i+1 while it receives
  // message i.
  virtual void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes,
                             uint64_t send_tag, int recv_peer, void* recv_data, size_t recv_bytes,
                             uint64_t recv_tag, const Deadline& deadline) = 0;

  // Payload bytes a send to any peer is guaranteed to hand over while that peer reads nothing (a
  // socket's send buffer); 0 if unknown. An algorithm may keep one message of at most this size in
  // flight ahead of the one it receives without risking a deadlock; it must not assume more.
  virtual size_t send_buffer_bytes() const { return 0; }

  // Capability: the host lane a network rail was paired with for the hierarchical allreduce
  // (host_lane.h), once connect() found a host with several ranks; null otherwise (allreduces on
  // this rail then run flat).
  virtual HostLane* host_lane() { return nullptr; }
};

}  // namespace nezha::transport
