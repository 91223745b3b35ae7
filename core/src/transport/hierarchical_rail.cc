#include "transport/hierarchical_rail.h"

#include <cstring>

#include "common/error.h"

namespace nezha::transport {

HierarchicalRail::HierarchicalRail(std::unique_ptr<Rail> network, std::unique_ptr<Rail> host_lane)
    : network_owner_(std::move(network)),
      lane_owner_(std::move(host_lane)),
      network_(network_owner_->as_point_to_point()),
      lane_(lane_owner_.get()) {
  if (!network_ || !(lane_->as_point_to_point() || lane_->as_collective()) ||
      network_->properties().reach != RailReach::kJob || lane_->properties().reach != RailReach::kHost)
    throw InvalidArgument("rail '" + network_owner_->properties().name + "' with lane '" +
                          lane_owner_->properties().name +
                          "': a hierarchical rail pairs a point-to-point network rail with a host-local one");
  properties_ = network_->properties();
  properties_.kind += "+" + lane_->properties().kind;
  properties_.host_memory = network_->properties().host_memory && lane_->properties().host_memory;
  properties_.can_fail_alone = network_->properties().can_fail_alone || lane_->properties().can_fail_alone;
}

HierarchicalRail::~HierarchicalRail() { close(); }

std::string HierarchicalRail::local_address() const {
  const std::string net = network_->local_address();
  const uint32_t n = static_cast<uint32_t>(net.size());
  std::string out(sizeof(n), '\0');
  std::memcpy(&out[0], &n, sizeof(n));
  return out + net + lane_->local_address();
}

void split_hierarchical_address(const std::string& packed, const std::string& who, std::string& network,
                                std::string& lane) {
  uint32_t n = 0;
  if (packed.size() < sizeof(n)) throw InvalidArgument(who + ": not a hierarchical rail address");
  std::memcpy(&n, packed.data(), sizeof(n));
  if (packed.size() - sizeof(n) < n) throw InvalidArgument(who + ": hierarchical rail address is truncated");
  network = packed.substr(sizeof(n), n);
  lane = packed.substr(sizeof(n) + n);
}

void HierarchicalRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  std::vector<std::string> net(addresses_by_rank.size()), lane(addresses_by_rank.size()), keys;
  for (size_t r = 0; r < addresses_by_rank.size(); ++r)
    split_hierarchical_address(addresses_by_rank[r],
                               "rail '" + properties_.name + "', rank " + std::to_string(r) + "'s address",
                               net[r], lane[r]);
  for (const auto& a : lane) keys.push_back(lane_->host_key(a));
  placement_ = HostPlacement::from_keys(keys);
  network_->connect(net, deadline);
  lane_->connect(lane, deadline);
  hierarchical_ = placement_.hosts() < size();  // some host has several ranks
}

void HierarchicalRail::reset() {
  network_->reset();
  lane_->reset();
}

void HierarchicalRail::close() {
  network_->close();
  lane_->close();
}

RailCounters HierarchicalRail::counters() const {
  RailCounters a = network_->counters(), b = lane_->counters();
  return {a.bytes_sent + b.bytes_sent, a.bytes_received + b.bytes_received};
}

void HierarchicalRail::abort(const std::string& reason) {
  network_->abort(reason);
  lane_->abort(reason);
}

}  // namespace nezha::transport
