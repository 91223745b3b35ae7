// The names in /dev/shm now: tests of the shared-memory transports compare them before and after a
// job to show that nothing was left behind (the rails use sealed memfds and abstract sockets, so a
// job, killed ranks included, must leave /dev/shm as it found it).
#pragma once

#include <dirent.h>

#include <set>
#include <string>

namespace nezha::transport::testing {

inline std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

}  // namespace nezha::transport::testing
