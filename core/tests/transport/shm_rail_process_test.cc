// ShmRail between real processes (fork): a sendrecv ring of 4 processes, a peer SIGKILLed or
// SIGSTOPped while another waits on it (named at once / at the deadline), and what the segments are:
// memfds, never files in /dev/shm, so nothing is left there even when every rank is SIGKILLed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "shm_mesh.h"
#include "tcp_mesh.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::pattern;
using testing::small_ring_config;

// Each child: creates its rail, reports its address, receives everyone's, connects, runs body,
// and reports one line ("ok" or the error) before exiting. Rank r's pipe pair is in fds.
struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
};

void write_all(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  if (::write(fd, &n, 4) != 4 || ::write(fd, s.data(), n) != static_cast<ssize_t>(n)) _exit(90);
}
bool read_all(int fd, std::string* s) {
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

class ProcessJob {
 public:
  // body(rail) runs in each child; its result line is what it returns, or the exception text.
  ProcessJob(int n, const std::function<std::string(ShmRail&)>& body) : n_(n), children_(n) {
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
          ShmRail rail(small_ring_config("process-job"), r, n);
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
  ~ProcessJob() {
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

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(ShmRailProcesses, SendrecvRingOfFourProcesses) {
  const int n = 4;
  ProcessJob job(n, [n](ShmRail& rail) -> std::string {
    const int r = rail.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t bytes = (3 << 20) + 11;
    for (size_t round = 0; round < 2; ++round) {
      const auto out = pattern(r, round, bytes);
      std::vector<uint8_t> in(bytes);
      rail.sendrecv(next, out.data(), bytes, prev, in.data(), bytes, 50 + round, Deadline::after_seconds(20));
      if (first_mismatch(in, prev, round) != -1) return "wrong bytes from rank " + std::to_string(prev);
    }
    return "ok";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(job.result(r), "ok") << "rank " << r;
}

TEST(ShmRailProcesses, KilledPeerIsNamedWellUnderASecond) {
  ProcessJob job(3, [](ShmRail& rail) -> std::string {
    if (rail.rank() == 0) {
      ::pause();  // killed by the test
      return "not killed";
    }
    std::vector<uint8_t> buf(1 << 20);
    const auto t = Clock::now();
    try {
      // Rank 1 waits to receive from rank 0; rank 2 blocks sending more than the ring holds.
      if (rail.rank() == 1) rail.recv(0, 1, buf.data(), buf.size(), Deadline::after_seconds(30));
      else rail.send(0, 1, buf.data(), buf.size(), Deadline::after_seconds(30));
      return "returned";
    } catch (const PeerError& e) {
      const double s = std::chrono::duration<double>(Clock::now() - t).count();
      return std::string(s < 1.0 ? "fast: " : "slow: ") + e.what();
    }
  });
  ::usleep(200 * 1000);
  job.kill(0, SIGKILL);
  for (int r : {1, 2}) {
    const std::string line = job.result(r);
    EXPECT_EQ(line.rfind("fast: ", 0), 0u) << line;
    EXPECT_NE(line.find("rank 0"), std::string::npos) << line;
    EXPECT_NE(line.find("exited"), std::string::npos) << line;
  }
}

TEST(ShmRailProcesses, FrozenPeerIsATimeoutAtTheDeadline) {
  ProcessJob job(2, [](ShmRail& rail) -> std::string {
    if (rail.rank() == 0) {
      ::pause();
      return "not stopped";
    }
    std::vector<uint8_t> buf(64);
    const auto t = Clock::now();
    try {
      rail.recv(0, 1, buf.data(), buf.size(), Deadline::after_seconds(1.0));
      return "returned";
    } catch (const TimeoutError& e) {
      const double s = std::chrono::duration<double>(Clock::now() - t).count();
      return std::string(s >= 0.95 && s < 3 ? "at deadline: " : "off: ") + e.what();
    }
  });
  job.kill(0, SIGSTOP);
  const std::string line = job.result(1);
  EXPECT_EQ(line.rfind("at deadline: ", 0), 0u) << line;
  EXPECT_NE(line.find("rank 0"), std::string::npos) << line;
  EXPECT_NE(line.find("shm-test"), std::string::npos) << line;
  job.kill(0, SIGKILL);
}

TEST(ShmRailProcesses, SegmentsAreMemfdsAndNothingIsLeftInDevShmAfterSigkill) {
  const auto before = dev_shm_entries();
  {
    ProcessJob job(3, [](ShmRail&) -> std::string {
      ::pause();
      return "";
    });
    for (int r = 0; r < 3; ++r) {
      // Each rank maps its own segment and its two peers': all anonymous memfds.
      const std::string maps = read_file("/proc/" + std::to_string(job.pid(r)) + "/maps");
      size_t memfds = 0;
      for (size_t at = maps.find("/memfd:nezha-shm"); at != std::string::npos;
           at = maps.find("/memfd:nezha-shm", at + 1))
        ++memfds;
      EXPECT_EQ(memfds, 3u) << "rank " << r << " maps:\n" << maps;
      EXPECT_EQ(maps.find("/dev/shm/"), std::string::npos) << maps;
    }
    for (int r = 0; r < 3; ++r) job.kill(r, SIGKILL);
    for (int r = 0; r < 3; ++r) job.reap(r);
  }
  for (const auto& name : dev_shm_entries())
    EXPECT_TRUE(before.count(name) || name.find("nezha") == std::string::npos) << "left in /dev/shm: " << name;
}

}  // namespace
}  // namespace nezha::transport
