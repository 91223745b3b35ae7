// ShmRail between real processes (fork): a sendrecv ring of 4 processes, a peer SIGKILLed or
// SIGSTOPped while another waits on it, or before their pair's first link (named at once / at the
// deadline), and what the segments are: memfds mapped by partners only, never files in /dev/shm, so
// nothing is left there even when every rank is SIGKILLed.
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
#include "shm_process_job.h"
#include "tcp_mesh.h"
#include "transport/dev_shm_entries.h"

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::pattern;
using testing::ProcessJob;
using testing::small_ring_config;

ShmRailConfig process_config() { return small_ring_config("process-job"); }

using testing::dev_shm_entries;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(ShmRailProcesses, SendrecvRingOfFourProcesses) {
  const int n = 4;
  for (bool direct : {true, false}) {  // process_vm_readv from the sender, or through the ring
  SCOPED_TRACE(direct ? "direct" : "streamed");
  ShmRailConfig config = process_config();
  config.direct = direct;
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
  }, config);
  for (int r = 0; r < n; ++r) EXPECT_EQ(job.result(r), "ok") << "rank " << r;
  }
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
  }, process_config());
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
  }, process_config());
  job.kill(0, SIGSTOP);
  const std::string line = job.result(1);
  EXPECT_EQ(line.rfind("at deadline: ", 0), 0u) << line;
  EXPECT_NE(line.find("rank 0"), std::string::npos) << line;
  EXPECT_NE(line.find("shm-test"), std::string::npos) << line;
  job.kill(0, SIGKILL);
}

// Memfd segments mapped by a process.
size_t mapped_segments(pid_t pid) {
  const std::string maps = read_file("/proc/" + std::to_string(pid) + "/maps");
  EXPECT_EQ(maps.find("/dev/shm/"), std::string::npos) << maps;
  size_t memfds = 0;
  for (size_t at = maps.find("/memfd:nezha-shm"); at != std::string::npos; at = maps.find("/memfd:nezha-shm", at + 1))
    ++memfds;
  return memfds;
}

TEST(ShmRailProcesses, SegmentsAreMemfdsMappedByPartnersOnlyAndNothingIsLeftInDevShmAfterSigkill) {
  const auto before = dev_shm_entries();
  {
    // Ranks 0 and 1 exchange a message; rank 2 talks to no one. Then all wait to be killed.
    ProcessJob job(3, [](ShmRail& rail) -> std::string {
      std::vector<uint8_t> buf(64);
      const Deadline d = Deadline::after_seconds(10);
      if (rail.rank() == 0) rail.send(1, 1, buf.data(), buf.size(), d);
      if (rail.rank() == 1) rail.recv(0, 1, buf.data(), buf.size(), d);
      ::pause();
      return "";
    }, process_config());
    // Each maps its own segment and its partner's, once the pair has linked; rank 2 only its own.
    const Deadline linked = Deadline::after_seconds(10);
    while ((mapped_segments(job.pid(0)) < 2 || mapped_segments(job.pid(1)) < 2) && !linked.expired())
      ::usleep(10 * 1000);
    EXPECT_EQ(mapped_segments(job.pid(0)), 2u);
    EXPECT_EQ(mapped_segments(job.pid(1)), 2u);
    EXPECT_EQ(mapped_segments(job.pid(2)), 1u);
    for (int r = 0; r < 3; ++r) job.kill(r, SIGKILL);
    for (int r = 0; r < 3; ++r) job.reap(r);
  }
  for (const auto& name : dev_shm_entries())
    EXPECT_TRUE(before.count(name) || name.find("nezha") == std::string::npos) << "left in /dev/shm: " << name;
}

TEST(ShmRailProcesses, APeerKilledBeforeItsFirstLinkIsNamedAtOnce) {
  ProcessJob job(2, [](ShmRail& rail) -> std::string {
    if (rail.rank() == 0) {
      ::pause();
      return "not killed";
    }
    ::usleep(300 * 1000);  // rank 0 is dead by now, its segment never handed over
    std::vector<uint8_t> buf(64);
    const auto t = Clock::now();
    try {
      rail.recv(0, 1, buf.data(), buf.size(), Deadline::after_seconds(30));
      return "returned";
    } catch (const PeerError& e) {
      const double s = std::chrono::duration<double>(Clock::now() - t).count();
      return std::string(s < 1.0 ? "fast: " : "slow: ") + e.what();
    }
  }, process_config());
  job.kill(0, SIGKILL);
  job.reap(0);
  const std::string line = job.result(1);
  EXPECT_EQ(line.rfind("fast: ", 0), 0u) << line;
  EXPECT_NE(line.find("rank 0"), std::string::npos) << line;
  EXPECT_NE(line.find("exited"), std::string::npos) << line;
}

TEST(ShmRailProcesses, APeerFrozenBeforeItsFirstLinkIsATimeoutAtTheDeadline) {
  ProcessJob job(2, [](ShmRail& rail) -> std::string {
    if (rail.rank() == 0) {
      ::pause();
      return "not stopped";
    }
    ::usleep(300 * 1000);  // rank 0 is stopped by now: its segment server cannot answer
    std::vector<uint8_t> buf(64);
    const auto t = Clock::now();
    try {
      rail.send(0, 1, buf.data(), buf.size(), Deadline::after_seconds(1.0));
      return "returned";
    } catch (const TimeoutError& e) {
      const double s = std::chrono::duration<double>(Clock::now() - t).count();
      return std::string(s >= 0.95 && s < 3 ? "at deadline: " : "off: ") + e.what();
    }
  }, process_config());
  job.kill(0, SIGSTOP);
  const std::string line = job.result(1);
  EXPECT_EQ(line.rfind("at deadline: ", 0), 0u) << line;
  EXPECT_NE(line.find("rank 0"), std::string::npos) << line;
  EXPECT_NE(line.find("shm-test"), std::string::npos) << line;
  job.kill(0, SIGKILL);
}

}  // namespace
}  // namespace nezha::transport
