// The table of rail kinds make_rail() knows. Adding a transport: put it in a folder under
// core/src/transport/ with a maker `std::unique_ptr<Rail> make_<kind>_rail(const RailSpec&,
// const RailContext&)`, include its header here and add one line to kBuiltinRailKinds.
#include "transport/rail_kinds.h"

#include "transport/tcp/tcp_rail.h"
#include "transport/ofi/ofi_rail.h"
#include "transport/shm/shm_rail.h"
#include "transport/agg/agg_rail.h"

namespace nezha::transport {

const std::vector<RailKind>& builtin_rail_kinds() {
  static const std::vector<RailKind> kBuiltinRailKinds = {
      {"tcp", &make_tcp_rail},
      {"mptcp", &make_tcp_rail},
      {"shm", &make_shm_rail},
      {"ofi", &make_ofi_rail, true},  // throws a NezhaError naming libfabric when built without it
      {"agg", &make_agg_rail},
  };
  return kBuiltinRailKinds;
}

bool rail_kind_target_may_contain_semicolons(const std::string& kind) {
  for (const RailKind& k : builtin_rail_kinds())
    if (k.kind == kind) return k.target_may_contain_semicolons;
  return false;
}

// Kinds that can also carry the engine's control channel (message_path.h).
const std::vector<MessagePathKind>& builtin_message_path_kinds() {
  static const std::vector<MessagePathKind> kBuiltinMessagePathKinds = {
      {"tcp", &make_tcp_message_path},
      {"mptcp", &make_tcp_message_path},
  };
  return kBuiltinMessagePathKinds;
}

}  // namespace nezha::transport
