// The table of rail kinds, one row each. Adding a transport: put it in a folder under
// core/src/transport/ with a maker `std::unique_ptr<Rail> make_<kind>_rail(const RailSpec&,
// const RailContext&)`, include its header here and add its row (rail_factory.h says what the
// fields mean). Nothing else names a kind: the grammar, nezha/rails.py and the messages read this.
#include "transport/agg/agg_rail.h"
#include "transport/ofi/ofi_rail.h"
#include "transport/rail_factory.h"
#include "transport/shm/shm_message_path.h"
#include "transport/shm/shm_rail.h"
#include "transport/shm_coll/shm_coll_rail.h"
#include "transport/tcp/tcp_rail.h"

namespace nezha::transport {

const std::vector<RailKind>& builtin_rail_kinds() {
  using T = RailTarget;
  static const std::vector<RailKind> kRows = {
      // kind     maker            target                       ';' continues  control path
      {"tcp",   &make_tcp_rail,  T::kLocalAddress,            false, &make_tcp_message_path},
      {"mptcp", &make_tcp_rail,  T::kLocalAddress,            false, nullptr},
      // Its control path links only the ranks of one host: the control channel's host path.
      {"shm",   &make_shm_rail,  T::kNone,                    false, &make_shm_message_path},
      // A collective rail: allreduces of a job whose ranks all share this host, reduced in place.
      {"shmcoll", &make_shm_coll_rail, T::kNone,              false, nullptr},
      // Without libfabric's headers at build time the maker raises a NezhaError naming libfabric.
      {"ofi",   &make_ofi_rail,  T::kProviderAtLocalAddress,  true,  nullptr},
      {"agg",   &make_agg_rail,  T::kHostPort,                false, nullptr},
  };
  return kRows;
}

}  // namespace nezha::transport
