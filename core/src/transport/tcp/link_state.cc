#include "transport/tcp/link_state.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

namespace nezha::transport::tcp {
namespace {

std::string interface_holding(const std::string& ipv4) {
  in_addr want{};
  if (::inet_pton(AF_INET, ipv4.c_str(), &want) != 1 || want.s_addr == htonl(INADDR_ANY)) return {};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      name = a->ifa_name;
      break;
    }
  }
  ::freeifaddrs(list);
  return name;
}

}  // namespace

LinkState::LinkState(const std::string& ipv4) : ipv4_(ipv4), interface_(interface_holding(ipv4)) {
  if (!interface_.empty() && interface_.size() < IFNAMSIZ)
    probe_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
}

std::string LinkState::fault() const {
  if (!probe_.valid()) return {};
  ifreq req{};
  std::memcpy(req.ifr_name, interface_.data(), interface_.size());
  if (::ioctl(probe_.get(), SIOCGIFFLAGS, &req) != 0) return {};  // gone or renamed: not ours to judge
  const auto flags = static_cast<unsigned>(req.ifr_flags);
  if (!(flags & IFF_UP)) return "interface " + interface_ + " (" + ipv4_ + ") is down";
  if (!(flags & IFF_RUNNING)) return "interface " + interface_ + " (" + ipv4_ + ") has no carrier";
  return {};
}

}  // namespace nezha::transport::tcp
