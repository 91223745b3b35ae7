// Internal to the factory: the built-in table of rail kinds (rail_kinds.cc).
#pragma once

#include <string>
#include <vector>

#include "transport/rail_factory.h"

namespace nezha::transport {

struct RailKind {
  std::string kind;
  RailMaker maker;
  // The kind's target may contain ';' (ofi's provider "tcp;ofi_rxm"): a ';'-part without '=' then
  // continues the target instead of being a malformed option.
  bool target_may_contain_semicolons = false;
};

// Whether `kind` is built in and its target may contain ';' (parse_rail_spec).
bool rail_kind_target_may_contain_semicolons(const std::string& kind);

const std::vector<RailKind>& builtin_rail_kinds();

using MessagePathMaker = std::unique_ptr<MessagePath> (*)(const RailSpec&, const RailContext&);
struct MessagePathKind {
  std::string kind;
  MessagePathMaker maker;
};
const std::vector<MessagePathKind>& builtin_message_path_kinds();

}  // namespace nezha::transport
