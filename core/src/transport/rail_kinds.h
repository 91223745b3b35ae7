// Internal to the factory: the built-in table of rail kinds (rail_kinds.cc).
#pragma once

#include <string>
#include <vector>

#include "transport/rail_factory.h"

namespace nezha::transport {

struct RailKind {
  std::string kind;
  RailMaker maker;
};

const std::vector<RailKind>& builtin_rail_kinds();

using MessagePathMaker = std::unique_ptr<MessagePath> (*)(const RailSpec&, const RailContext&);
struct MessagePathKind {
  std::string kind;
  MessagePathMaker maker;
};
const std::vector<MessagePathKind>& builtin_message_path_kinds();

}  // namespace nezha::transport
