// The rail factory: builds a rail (point-to-point or collective: rail.h) from one item of the user's rail list, without the caller naming
// a transport. Every kind is one row of one table (rail_kinds.cc): its maker, how its target
// resolves, whether ';' continues that target, and whether it can carry the control channel. Adding
// a transport is a folder under core/src/transport/ plus one row there; the grammar (rail_spec.h),
// Python's address resolution (nezha/rails.py) and the error messages all follow the row.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "transport/message_path.h"
#include "transport/rail.h"
#include "transport/rail_spec.h"

namespace nezha::transport {

// dst[i] = dst[i] (op) src[i] for i < count: the elementwise kernel a rail that reduces on this host
// runs (collectives/reduce.h's reduce_into; the transport layer sits below the kernels, so whoever
// builds rails hands it in).
using ReduceKernel = void (*)(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

struct RailContext {
  int rank = 0, size = 1;
  int rail_index = 0;          // -1: control paths
  std::string secret;          // job secret (authentication, and unguessable shm names)
  std::string host_id;         // the launcher's host entry for this rank (placement); may be empty
  size_t socket_buffer_bytes = 4 << 20;
  double handshake_timeout_s = 5;
  ReduceKernel reduce_into = nullptr;  // for rails that reduce on this host (shmcoll); null: none
  int local_size = 0;          // ranks on this rank's host (the launcher's placement); 0: as size
  // Control paths: bytes the shared-memory path adds after rank 0's rings for every linked rank to
  // map (MessagePath::host_board); the same on every rank. 0: none.
  size_t host_board_bytes = 0;
};

// Whether this host's ranks outnumber the cores this process may use. Then a rank waiting on a
// shared-memory peer most likely waits for one that has no core: spinning first only keeps the core
// from it, and every wait is a sleep and a wake-up (benchmarks/SHM.md).
bool ranks_outnumber_cores(const RailContext& ctx);

using RailMaker = std::unique_ptr<Rail> (*)(const RailSpec&, const RailContext&);
using MessagePathMaker = std::unique_ptr<MessagePath> (*)(const RailSpec&, const RailContext&);

// One row of the kind table.
struct RailKind {
  std::string kind;                    // the name in a spec ("tcp"), lower case
  RailMaker maker = nullptr;
  RailTarget target = RailTarget::kNone;
  // A ';'-part without '=' continues the target (ofi's provider "tcp;ofi_rxm") instead of being a
  // malformed option; options are always key=value, so the split stays unambiguous.
  bool target_continues_after_semicolon = false;
  // Set for kinds that can also carry the engine's control channel (message_path.h).
  MessagePathMaker message_path = nullptr;
};

// Builds a rail of spec.kind. Throws InvalidArgument naming an unknown kind (and the known ones);
// the maker throws InvalidArgument for options it does not know, NezhaError if the rail cannot be
// opened (e.g. an address that cannot be bound).
std::unique_ptr<Rail> make_rail(const RailSpec& spec, const RailContext& ctx);

// A message path (message_path.h) for the engine's control channel, of a kind whose row has one.
// Throws InvalidArgument naming a kind that cannot carry control messages.
std::unique_ptr<MessagePath> make_message_path(const RailSpec& spec, const RailContext& ctx);

// Adds one row at run time (tests; plugins). Throws InvalidArgument if the kind is already known,
// the name is empty or not lower case, or there is no maker. Thread-safe.
void register_rail_kind(const RailKind& row);

// The table: every row make_rail() knows, built-in and registered, sorted by kind.
std::vector<RailKind> rail_kind_table();
// The row of `kind`, or nullptr; the pointer stays valid (rows are never removed).
const RailKind* find_rail_kind(const std::string& kind);
// Every kind make_rail() accepts, sorted.
std::vector<std::string> known_rail_kinds();

// Helpers for makers: the value of an option as a number, or a default; InvalidArgument naming the
// rail and option if it is not a number. reject_unknown_options throws InvalidArgument naming the
// first option of spec not in `known`.
size_t rail_option_bytes(const RailSpec& spec, const std::string& option, size_t fallback);
void reject_unknown_options(const RailSpec& spec, const std::vector<std::string>& known);

}  // namespace nezha::transport
