// The cores this process may run on (its affinity mask): what "more ranks than cores" is measured
// against when a wait should sleep at once rather than spin.
#pragma once

#include <sched.h>

#include <algorithm>

namespace nezha {

inline int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace nezha
