// The rail factory: builds a Rail from one entry of the user's rail list, without the caller naming
// a transport. The kinds it knows live in one table (rail_kinds.cc): adding a transport is a folder
// under core/src/transport/ plus one registration line there.
//
// Spec strings: one item of NEZHA_RAILS / nezha.init(rails=...) (a comma list of items, parsed in
// Python by nezha/rails.py; parse_rail_spec() parses one item for C++ callers and tests):
//   "eth1", "10.0.0.0/24", "127.0.0.1"   -> kind "tcp" (the default)
//   "tcp:eth1", "mptcp:10.0.0.0/24"       -> that kind, over that interface/subnet/address
//   "shm"                                 -> a kind alone (no address)
//   "shm;segment_bytes=8388608"           -> kind-specific options after semicolons
//   "ofi:tcp;ofi_rxm@10.0.0.1;window=4"   -> a kind whose target may contain ';' (rail_kinds.cc): a
//                                            ';'-part without '=' continues the target, options
//                                            are the parts with '=' (here target "tcp;ofi_rxm@10.0.0.1")
// The Python side resolves names to local_addr (the IP to bind); the factory never resolves names.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/message_path.h"
#include "transport/rail.h"

namespace nezha::transport {

struct RailSpec {              // one entry of the user's rail list, parsed
  std::string kind = "tcp";    // "tcp" (default), "mptcp", "shm", ...
  std::string name;            // user-visible name ("eth1", "10.50.0.0/24", "shm")
  std::string local_addr;      // IP to bind for network rails; empty for shm
  std::map<std::string, std::string> options;  // kind-specific ("segment_bytes=...", ...)
};

struct RailContext {
  int rank = 0, size = 1;
  int rail_index = 0;          // -1: control paths
  std::string secret;          // job secret (authentication, and unguessable shm names)
  std::string host_id;         // the launcher's host entry for this rank (placement); may be empty
  size_t socket_buffer_bytes = 4 << 20;
  double handshake_timeout_s = 5;
};

using RailMaker = std::unique_ptr<Rail> (*)(const RailSpec&, const RailContext&);

// Builds a rail of spec.kind. Throws InvalidArgument naming an unknown kind (and the known ones);
// the maker throws InvalidArgument for options it does not know, NezhaError if the rail cannot be
// opened (e.g. an address that cannot be bound).
std::unique_ptr<Rail> make_rail(const RailSpec& spec, const RailContext& ctx);

// A message path (message_path.h) for the engine's control channel, of a kind that has one
// (tcp, mptcp). Throws InvalidArgument naming a kind that cannot carry control messages.
std::unique_ptr<MessagePath> make_message_path(const RailSpec& spec, const RailContext& ctx);

// Registers one more kind at run time (tests; plugins). Throws InvalidArgument if the kind is
// already known or the name is empty. Thread-safe.
void register_rail_kind(const std::string& kind, RailMaker maker);

// Every kind make_rail() accepts, sorted.
std::vector<std::string> known_rail_kinds();

// Parses one spec string (grammar above). Throws InvalidArgument on an empty spec, an empty kind or
// address, or an option without '='. For a network kind, name and local_addr are both the address
// text (C++ callers pass IPs; Python resolves interface names and subnets first).
RailSpec parse_rail_spec(const std::string& text);

// Helpers for makers: the value of an option as a number, or a default; InvalidArgument naming the
// rail and option if it is not a number. reject_unknown_options throws InvalidArgument naming the
// first option of spec not in `known`.
size_t rail_option_bytes(const RailSpec& spec, const std::string& option, size_t fallback);
void reject_unknown_options(const RailSpec& spec, const std::vector<std::string>& known);

}  // namespace nezha::transport
