// Whether the network interface a rail's traffic leaves from still has a link. A pulled cable, a
// dead switch port or a NIC that lost its link drops the interface's carrier at once, while TCP
// just retransmits quietly for minutes: the rail watchdog reads this a few times per silence limit
// and fails the rail over on the spot instead of waiting out the limit (and, unlike silence, a
// missing carrier is never a late peer or a starved CPU). Faults beyond the first hop (a dead
// switch uplink) leave the carrier up: those the silence limit still catches.
#pragma once

#include <string>

#include "transport/tcp/socket.h"

namespace nezha::transport::tcp {

class LinkState {
 public:
  // Finds the interface that holds `ipv4` (in this process's network namespace). None (an address
  // of another host, 0.0.0.0, an interface that went away): fault() always reports "" (unknown).
  explicit LinkState(const std::string& ipv4);

  // "" while the interface is up with a carrier (or is unknown); otherwise why not, e.g.
  // "interface rail1 (10.50.0.2) has no carrier". Thread-safe; one ioctl, no allocation when up.
  std::string fault() const;
  const std::string& interface() const { return interface_; }
  const std::string& ipv4() const { return ipv4_; }

 private:
  std::string ipv4_;
  std::string interface_;
  Fd probe_;  // a datagram socket for SIOCGIFFLAGS
};

}  // namespace nezha::transport::tcp
