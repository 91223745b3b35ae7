// Names the calling thread (shown by top -H, ps -L, gdb, py-spy and /proc/<pid>/task/*/comm), so a
// profile of a rank tells the engine's threads from the framework's.
#pragma once

#include <pthread.h>

namespace nezha {

// Linux keeps at most 15 characters; longer names are cut, not refused.
inline void name_this_thread(const char* name) {
  char cut[16] = {};
  for (int i = 0; i < 15 && name[i]; ++i) cut[i] = name[i];
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace nezha
