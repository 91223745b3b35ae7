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

}  // namespace nezha::transport
