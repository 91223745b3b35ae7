// Test helper: a shm job of real processes (fork). Each child creates its rail, the parent relays
// the addresses over pipes, the children connect and run a body whose result line the parent reads.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "transport/shm/shm_rail.h"

namespace nezha::transport::testing {

// Each child: creates its rail, reports its address, receives everyone's, connects, runs body,
// and reports one line ("ok" or the error) before exiting. Rank r's pipe pair is in fds.
struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
};

inline void write_all(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  if (::write(fd, &n, 4) != 4 || ::write(fd, s.data(), n) != static_cast<ssize_t>(n)) _exit(90);
}
inline bool read_all(int fd, std::string* s) {
  uint32_t n = 0;
  if (::read(fd, &n, 4) != 4) return false;
  s->resize(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, s->data() + got, n - got);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

// RailT(config, rank, size) is any rail of one host's ranks (ShmRail, ShmCollRail).
template <class RailT, class ConfigT>
class BasicProcessJob {
 public:
  // body(rail) runs in each child; its result line is what it returns, or the exception text.
  BasicProcessJob(int n, const std::function<std::string(RailT&)>& body, ConfigT config)
      : n_(n), children_(n) {
    for (int r = 0; r < n; ++r) {
      int down[2], up[2];
      EXPECT_EQ(::pipe(down), 0);
      EXPECT_EQ(::pipe(up), 0);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(down[1]);
        ::close(up[0]);
        std::string line;
        try {
          RailT rail(config, r, n);
          write_all(up[1], rail.local_address());
          std::vector<std::string> addrs(n);
          for (auto& a : addrs)
            if (!read_all(down[0], &a)) _exit(91);
          rail.connect(addrs, Deadline::after_seconds(10));
          write_all(up[1], "connected");
          line = body(rail);
        } catch (const std::exception& e) {
          line = std::string("error: ") + e.what();
        }
        write_all(up[1], line);
        _exit(0);
      }
      ::close(down[0]);
      ::close(up[1]);
      children_[r] = {pid, down[1], up[0]};
    }
    std::vector<std::string> addrs(n);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(read_all(children_[r].from_child, &addrs[r]));
    for (int r = 0; r < n; ++r)
      for (const auto& a : addrs) write_all(children_[r].to_child, a);
    for (int r = 0; r < n; ++r) {
      std::string line;
      EXPECT_TRUE(read_all(children_[r].from_child, &line));
      EXPECT_EQ(line, "connected") << "rank " << r;
    }
  }
  ~BasicProcessJob() {
    for (auto& c : children_) {
      if (c.pid > 0) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
      }
      ::close(c.to_child);
      ::close(c.from_child);
    }
  }
  pid_t pid(int r) const { return children_[r].pid; }
  std::string result(int r) {
    std::string line;
    if (!read_all(children_[r].from_child, &line)) return "(no result: the process died)";
    return line;
  }
  void kill(int r, int sig) { ::kill(children_[r].pid, sig); }
  void reap(int r) {
    ::waitpid(children_[r].pid, nullptr, 0);
    children_[r].pid = -1;
  }

 private:
  int n_;
  std::vector<Child> children_;
};

using ProcessJob = BasicProcessJob<ShmRail, ShmRailConfig>;

}  // namespace nezha::transport::testing
