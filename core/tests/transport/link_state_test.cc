// LinkState: finds the interface that holds a rail's address and says when it is down.
#include "transport/tcp/link_state.h"

#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace nezha::transport::tcp {
namespace {

TEST(LinkState, LoopbackIsFoundAndUp) {
  LinkState lo("127.0.0.1");
  EXPECT_EQ(lo.interface(), "lo");
  EXPECT_EQ(lo.fault(), "");
}

TEST(LinkState, AddressesOfNoLocalInterfaceAreUnknownNeverFaulty) {
  for (const char* addr : {"0.0.0.0", "203.0.113.7", "not an address", ""}) {
    LinkState s(addr);
    EXPECT_EQ(s.interface(), "") << addr;
    EXPECT_EQ(s.fault(), "") << addr;
  }
}

bool set_up(int fd, const char* name, bool up) {
  ifreq req{};
  std::strncpy(req.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(fd, SIOCGIFFLAGS, &req) != 0) return false;
  req.ifr_flags = static_cast<short>(up ? (req.ifr_flags | IFF_UP) : (req.ifr_flags & ~IFF_UP));
  return ::ioctl(fd, SIOCSIFFLAGS, &req) == 0;
}

// In a network namespace of its own (a thread's: the test process keeps its own), loopback is taken
// down under a LinkState: the fault names the interface and the address.
TEST(LinkState, AnInterfaceTakenDownIsReported) {
  std::string skip, fault_up, fault_down, name;
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      skip = std::string("no network namespace here (needs root): ") + std::strerror(errno);
      return;
    }
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || !set_up(fd, "lo", true)) {
      skip = "cannot bring loopback up in a new namespace";
      if (fd >= 0) ::close(fd);
      return;
    }
    LinkState lo("127.0.0.1");
    name = lo.interface();
    fault_up = lo.fault();
    set_up(fd, "lo", false);
    fault_down = lo.fault();
    ::close(fd);
  }).join();
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(name, "lo");
  EXPECT_EQ(fault_up, "");
  EXPECT_EQ(fault_down, "interface lo (127.0.0.1) is down");
}

}  // namespace
}  // namespace nezha::transport::tcp
