#include "engine/failover/redo_scope.h"

#include <algorithm>

namespace nezha::engine {

std::vector<bool> redo_can_save(const std::vector<RedoRail>& rails) {
  std::vector<bool> out(rails.size(), false);
  for (size_t i = 0; i < rails.size(); ++i) {
    if (!rails[i].can_fail_alone) continue;
    for (size_t j = 0; j < rails.size() && !out[i]; ++j) out[i] = j != i && rails[j].point_to_point;
  }
  return out;
}

bool failover_can_help(const std::vector<RedoRail>& rails) {
  const std::vector<bool> saved = redo_can_save(rails);
  return std::any_of(saved.begin(), saved.end(), [](bool b) { return b; });
}

}  // namespace nezha::engine
