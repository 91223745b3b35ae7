// make_ofi_rail: the factory's entry for kind "ofi" (registered in rail_kinds.cc). Built with or
// without libfabric, so that "ofi" is always a known kind: without it, asking for one says why not.
#include "common/error.h"
#include "transport/ofi/ofi_address.h"
#include "transport/ofi/ofi_rail.h"

namespace nezha::transport {

std::unique_ptr<Rail> make_ofi_rail(const RailSpec& spec, const RailContext& ctx) {
#ifdef NEZHA_WITH_OFI
  reject_unknown_options(spec, {"chunk_bytes", "window", "max_share_bytes"});
  const ofi::OfiTarget target = ofi::parse_target(spec.local_addr, spec.name);
  OfiRailConfig c;
  c.name = spec.name;
  c.provider = target.provider;
  c.node = target.node;
  c.rail_index = ctx.rail_index;
  c.secret = ctx.secret;
  c.handshake_timeout_s = ctx.handshake_timeout_s;
  c.chunk_bytes = rail_option_bytes(spec, "chunk_bytes", c.chunk_bytes);
  c.window = rail_option_bytes(spec, "window", c.window);
  c.max_share_bytes = rail_option_bytes(spec, "max_share_bytes", 0);
  return std::make_unique<OfiRail>(c, ctx.rank, ctx.size);
#else
  (void)ctx;
  throw NezhaError("rail '" + spec.name + "' (kind ofi): this build of Nezha has no libfabric support "
                   "(libfabric and its headers, Debian package libfabric-dev, were not found when "
                   "nezha._core was built); install libfabric-dev and rebuild to use ofi: rails");
#endif
}

}  // namespace nezha::transport
