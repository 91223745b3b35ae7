// The rail spec grammar: NEZHA_RAILS, `nezharun --rails`, nezha.init(rails=...). Parsed here and
// only here; nezha/rails.py calls parse_rail_list() through nezha._core and then resolves targets.
//
//   spec    := item ("," item)*
//   item    := [kind ":"] target (";" option)*     a kind whose row has a target
//            | kind (";" option)*                   a kind without one ("shm")
//   option  := key "=" value
//
// Without a kind, an item is "tcp". Whitespace around items, parts and '=' is dropped; kinds are
// case-insensitive. How the target reads is the kind's row (rail_kinds.cc, RailTarget below); where
// the row says so, a ';'-part without '=' continues the target ("ofi:tcp;ofi_rxm@10.0.0.0/24").
//   "eth1", "10.0.0.0/24", "127.0.0.1"   -> kind "tcp", target as written
//   "mptcp:10.0.0.0/24;max_share_bytes=4096"
//   "shm", "shm;ring_bytes=1048576"
//   "ofi:tcp;ofi_rxm@10.0.0.1;window=4"   -> target "tcp;ofi_rxm@10.0.0.1", option window
//   "agg:10.0.0.5:7219"
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace nezha::transport {

// How a kind's target becomes the address its maker binds or reaches. The grammar checks the
// target's shape; turning interfaces and subnets into addresses is the caller's (it knows the host).
enum class RailTarget {
  kNone,                    // no target: the kind alone ("shm")
  kLocalAddress,            // an interface, IPv4 subnet or address -> the local IPv4 address to bind
  kProviderAtLocalAddress,  // PROVIDER@WHERE, WHERE as kLocalAddress; PROVIDER alone binds nothing
  kHostPort,                // IPv4:PORT of a remote endpoint, used as written
};

const char* rail_target_name(RailTarget target);  // "none", "local_address", ...

// One item of the list as written: its target not resolved yet, options in the order given.
struct RailItem {
  std::string text;    // the item, trimmed (error messages name it)
  std::string kind;
  RailTarget target_form = RailTarget::kNone;
  std::string target;  // empty for kNone
  std::vector<std::pair<std::string, std::string>> options;
};

// One rail as the factory builds it.
struct RailSpec {
  std::string kind = "tcp";
  std::string name;        // user-visible: the target as written, or the kind when it has none
  // The resolved target: the IPv4 address to bind (kLocalAddress), PROVIDER@IPv4 or PROVIDER
  // (kProviderAtLocalAddress), IPv4:PORT (kHostPort); empty for kNone.
  std::string local_addr;
  std::map<std::string, std::string> options;  // kind-specific, checked by the maker
};

// Parses a comma list. Throws InvalidArgument naming the item: an empty item, an unknown kind (and
// the known ones), a target the kind's row does not accept, an option that is not key=value or is
// given twice.
std::vector<RailItem> parse_rail_list(const std::string& text);
RailItem parse_rail_item(const std::string& text);

// One item straight to a RailSpec, its target taken as resolved already (C++ callers and tests
// pass addresses, not interface names or subnets).
RailSpec parse_rail_spec(const std::string& text);

}  // namespace nezha::transport
