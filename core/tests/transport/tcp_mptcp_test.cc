// The same rail over MPTCP, when the kernel offers it.
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "tcp_mesh.h"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

namespace nezha::transport {
namespace {

using testing::first_mismatch;
using testing::loopback_config;
using testing::make_mesh;
using testing::pattern;
using testing::run_ranks;

// Empty when MPTCP sockets can be opened here, else why not.
std::string mptcp_unavailable() {
  std::ifstream enabled("/proc/sys/net/mptcp/enabled");
  int value = 0;
  if (!(enabled >> value)) return "/proc/sys/net/mptcp/enabled is missing (kernel without MPTCP)";
  if (value != 1) return "net.mptcp.enabled is " + std::to_string(value);
  const int fd = ::socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP);
  if (fd < 0) return std::string("socket(IPPROTO_MPTCP) failed: ") + std::strerror(errno);
  ::close(fd);
  return "";
}

TEST(TcpMptcp, MeshExchangesOverMptcp) {
  const std::string why = mptcp_unavailable();
  if (!why.empty()) GTEST_SKIP() << "MPTCP not available: " << why;
  TcpRailConfig config = loopback_config();
  config.mptcp = true;
  auto rails = make_mesh(3, config);
  EXPECT_EQ(rails[0]->properties().kind, "mptcp");
  const std::vector<size_t> sizes = {0, 1, (size_t{8} << 20) + 5};
  run_ranks(3, [&](int me) {
    const int right = (me + 1) % 3, left = (me + 2) % 3;
    for (size_t m = 0; m < sizes.size(); ++m) {
      const size_t bytes = sizes[m];
      auto out = pattern(me, m, bytes);
      std::vector<uint8_t> in(bytes);
      rails[me]->sendrecv(right, out.data(), out.size(), left, in.data(), in.size(), m, Deadline::after_seconds(20));
      EXPECT_EQ(first_mismatch(in, left, m), -1) << "rank " << me << " size " << bytes;
    }
  });
}

}  // namespace
}  // namespace nezha::transport
