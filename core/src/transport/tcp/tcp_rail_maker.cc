// make_tcp_rail: the factory's entry for kinds "tcp" and "mptcp" (registered in rail_kinds.cc).
#include "common/error.h"
#include "transport/tcp/tcp_rail.h"

namespace nezha::transport {

namespace {

TcpRailConfig make(const RailSpec& spec, const RailContext& ctx) {
  // max_share_bytes caps the share of one operation this rail takes (RailProperties); the other
  // options tune the sockets.
  reject_unknown_options(spec, {"max_share_bytes", "socket_buffer_bytes"});
  if (spec.local_addr.empty())
    throw InvalidArgument("rail '" + spec.name + "' (kind " + spec.kind +
                          "): needs a local address to bind (e.g. " + spec.kind + ":eth1)");
  TcpRailConfig tc;
  tc.name = spec.name;
  tc.local_addr = spec.local_addr;
  tc.rail_index = ctx.rail_index;
  tc.mptcp = spec.kind == "mptcp";
  tc.socket_buffer_bytes = rail_option_bytes(spec, "socket_buffer_bytes", ctx.socket_buffer_bytes);
  tc.secret = ctx.secret;
  tc.handshake_timeout_s = ctx.handshake_timeout_s;
  tc.max_share_bytes = rail_option_bytes(spec, "max_share_bytes", 0);
  return tc;
}

}  // namespace

std::unique_ptr<Rail> make_tcp_rail(const RailSpec& spec, const RailContext& ctx) {
  TcpRailConfig tc = make(spec, ctx);
  tc.connect_on_first_use = true;  // data: the pairs the algorithms use (tcp_rail.h)
  return std::make_unique<TcpRail>(tc, ctx.rank, ctx.size);
}

std::unique_ptr<MessagePath> make_tcp_message_path(const RailSpec& spec, const RailContext& ctx) {
  return std::make_unique<TcpRail>(make(spec, ctx), ctx.rank, ctx.size);  // negotiation: at once
}

}  // namespace nezha::transport
