#include "common/knobs.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace nezha {

const std::vector<KnobSpec>& knob_table() {
  static const std::vector<KnobSpec> table = {
      {"NEZHA_FUSION_THRESHOLD", "67108864", "Largest fused buffer (allreduce, allgather, reducescatter, broadcast), in bytes (0 disables fusion)."},
      {"NEZHA_UNFUSED_BYTES", "1048576", "Tensors of at least this many bytes are never fused: each runs alone (an allreduce reduced in its own output; fusing them costs a copy in and out of the fusion buffer and gains nothing at this size; 0: fuse any size up to NEZHA_FUSION_THRESHOLD). Raised on its own where the rails' measured start-up of a large operation (a ring's 2(n-1) steps, on hundreds of ranks) would be more than an eighth of such a tensor's time. Must be the same on every rank."},
      {"NEZHA_CYCLE_TIME_MS", "1", "How long the coordinator holds ready tensors while others are partially submitted, to fuse them."},
      {"NEZHA_TIMEOUT_S", "30", "Longest wait for a peer before an operation fails with NezhaError."},
      {"NEZHA_STALL_CHECK_S", "60", "Warn on every rank when some ranks submitted a tensor and others did not for this long, naming both (0 disables)."},
      {"NEZHA_STALL_SHUTDOWN_S", "0", "Fail stalled tensors with NezhaError after this long (0 disables)."},
      {"NEZHA_LOG_LEVEL", "warning", "trace, debug, info, warning or error."},
      {"NEZHA_TIMELINE", "", "Write a Chrome-trace timeline (negotiation per tensor, shares per rail) to this file; {rank} in it becomes the rank (every rank writes its own)."},
      {"NEZHA_LOGSTEP_MAX_BYTES", "65536", "Payloads up to this size use the log-step allreduce; larger ones halving/doubling up to NEZHA_HALVING_MAX_BYTES, the pipelined ring above."},
      {"NEZHA_HALVING_MAX_BYTES", "262144", "Allreduce payloads (of one rail's share) above NEZHA_LOGSTEP_MAX_BYTES and up to this size use halving/doubling (Rabenseifner: 2 log2(n) steps, the ring's bytes); larger ones the pipelined ring (2(n-1) steps). 0: the ring from NEZHA_LOGSTEP_MAX_BYTES on. Must be the same on every rank."},
      {"NEZHA_SEGMENT_BYTES", "1048576", "Pipeline segment size of the ring algorithms, in bytes (the ring sends one segment ahead where a socket buffers a whole segment)."},
      {"NEZHA_BALANCE_BYTES", "1048576", "Striped operations (every collective) of at least 4x this many bytes are re-split among their rails while they run: rank 0 hands each rail its next range (at least this long) as its last one ends, so a slow or slowed rail carries less (0: each rail keeps its planned share). Must be the same on every rank."},
      {"NEZHA_SOCKET_BUFFER_BYTES", "4194304", "SO_SNDBUF/SO_RCVBUF requested for data sockets (capped by net.core.wmem_max/rmem_max; below NEZHA_SEGMENT_BYTES the ring runs unpipelined)."},
      {"NEZHA_CACHE_ROUNDS", "0", "1: cached allreduces are agreed among the ranks directly in cache rounds instead of through rank 0 (off by default: twice the messages, and no faster)."},
      {"NEZHA_CONTROL_INLINE_BYTES", "16384", "Allreduces, broadcasts and allgathers small enough that rank 0 receives and sends at most this many bytes for one of them (per rank: this / (ranks - 1); for an allgather this / ((ranks - 1) x ranks)) travel with their negotiation: rank 0 reduces, relays or gathers them and returns the result with its response, with no rail exchange (lower latency for scalars, metrics and small objects). 0: off; at most 65536."},
      {"NEZHA_JAX_WAIT_US", "1000", "nezha.jax inside jit: a collective of at most 64 KB in all is waited for on XLA's own thread for up to this long, that thread running the engine loop meanwhile when the loop thread sleeps, before it is left to complete in the background (no thread wake-ups on a small collective's latency; bounded, so a collective that waits for another of the same program, or for a late rank, holds XLA's thread this long once; 0: always in the background)."},
      {"NEZHA_LEAD_US", "50000", "A synchronous collective (nezha.allreduce and the other numpy functions, the synchronous nezha.torch ones) runs the engine's loop on the calling thread for up to this long while the loop thread sleeps, until its operation is done or leaves negotiation for the rails, or something else wakes the loop (another thread's work, a rail failure, shutdown): no thread wake-ups on a small collective's latency, also where negotiation takes milliseconds (many ranks). An operation that left for one rail is then run on the calling thread as well, after the loop is handed back. 0: the loop thread does all; nezha.jax inside jit has NEZHA_JAX_WAIT_US."},
      {"NEZHA_OUTPUT_CACHE_BYTES", "536870912", "Results the engine allocates (allgather, alltoall, reducescatter) of 1 MiB and more are kept for reuse once freed, up to this many idle bytes, while an engine lives: a training loop's next call of the same size reuses the memory instead of having the kernel zero hundreds of MB of fresh pages (0: every result is freed)."},
      {"NEZHA_HOST_LANE", "shmcoll", "What runs the hierarchical allreduce's phases among the ranks of a host, where hosts hold several ranks: shmcoll (the collective shared-memory rail: each phase one pass over memory) or shm (the ring over the point-to-point shm rail). One-host jobs are unaffected. Must be the same on every rank."},
      {"NEZHA_HOST_VOTE", "1", "In a job whose ranks all share one host, a synchronous caller's small allreduce (up to 64 bytes, after its first time) is agreed and reduced through shared memory by every rank, without a round trip to rank 0 (0: through rank 0). Rank 0's setting decides for the job."},
      {"NEZHA_HOST_VOTE_SPIN_US", "50", "How long a rank voting on the host board (NEZHA_HOST_VOTE) yields its core in a loop, looking for the other ranks' inputs, before it sleeps until the last one comes."},
      {"NEZHA_SHM_CONTROL", "1", "Where the launcher places several ranks on a host, their negotiation (control messages) goes through shared memory instead of loopback TCP (0: TCP only)."},
      {"NEZHA_CONTROL_SPIN_US", "50", "With control through shared memory: a synchronous caller leading the engine loop looks at its shared-memory rings this long (yielding the CPU in between) before it sleeps, so an answer that comes within it costs no wake-up; only where the host has a core for every local rank (0: sleep at once)."},
      {"NEZHA_CONNECT_TIMEOUT_S", "60", "Longest wait for peers to connect at init()."},
      {"NEZHA_RAIL_FAILOVER", "1", "With several rails, go on when a rail fails (keeps a copy of each operation's input until every rank has it; 0: a rail failure fails its operations). Only where some rail can fail alone (a socket, a NIC) and another could redo its work: rails of shared memory fail only with a rank, which no redo can save."},
      {"NEZHA_RAIL_STALL_MS", "100", "With several rails: a rail that moves no data this long while it has work fails over to the other rails (the limit grows to 3x the longest pause seen on healthy operations)."},
      {"NEZHA_HIERARCHICAL", "1", "Where hosts hold several ranks and a host-local rail (shm) is listed or automatic: allreduce reduce-scatters inside each host over shared memory, allreduces each slice across hosts over the network rails, and allgathers inside each host (0: flat over the network rails; a listed shm rail is then refused on a multi-host job, an automatic one dropped)."},
      {"NEZHA_AUTO_SHM", "1", "Where the launcher places several ranks on a host, add a shared-memory rail by itself (with no rails given on one host it carries the allreduces; across hosts it is the hierarchical allreduce's host lane). 0: only the rails listed."},
      {"NEZHA_AUTO_SHM_COLL", "1", "A job of up to 8 ranks that the launcher places all on one host also gets a shared-memory collective rail by itself (shmcoll: every rank reduces its slice of each allreduce share straight from the others' memory; broadcasts, allgathers and reducescatters run on it the same way). Those operations of 64 KiB and more go to it, smaller ones to it or the shm ring, whichever the cost model finds faster (never striped together: they share the host's memory). Both rails fail only with a rank, so the job keeps no failover copies (benchmarks/SHM.md). 0: only the shm ring; NEZHA_AUTO_SHM=0 turns both off."},
  };
  return table;
}

namespace {
const KnobSpec& find(const char* env) {
  for (const auto& k : knob_table())
    if (std::strcmp(k.env, env) == 0) return k;
  throw InvalidArgument(std::string("unknown knob ") + env);
}
}  // namespace

std::string knob_string(const char* env) {
  const KnobSpec& spec = find(env);
  const char* v = std::getenv(env);
  return (v && *v) ? std::string(v) : std::string(spec.default_value);
}

int64_t knob_int(const char* env) {
  std::string s = knob_string(env);
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0')
    throw InvalidArgument(std::string(env) + "='" + s + "' is not an integer");
  return v;
}

double knob_double(const char* env) {
  std::string s = knob_string(env);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0')
    throw InvalidArgument(std::string(env) + "='" + s + "' is not a number");
  return v;
}

}  // namespace nezha
