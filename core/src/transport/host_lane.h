// HostLane: a network rail's capability to run the hierarchical allreduce
// (collectives::allreduce_hierarchical): the ranks of each host reduce among themselves over a
// host-local rail (the lane: shared memory), only the slice owners cross the network, then each host
// gathers the result over the lane again. The lane is a point-to-point rail in job rank space (the
// phases run the ring algorithms among the host's ranks) or a collective rail of this host's ranks
// (shmcoll as a host lane: it runs the reducescatter and allgather itself). PointToPointRail::host_lane() answers with it where the
// rail has a lane and some host holds several ranks (hierarchical_rail.h builds such rails).
//
// HostPlacement: which host each rank is on, as every rank computes it alike from the lanes'
// addresses (Rail::host_key), hosts numbered by their lowest rank.
#pragma once

#include <string>
#include <vector>

namespace nezha::transport {

class PointToPointRail;
class Rail;

// Which host each rank of the job is on (hosts numbered 0.. by their lowest rank).
struct HostPlacement {
  std::vector<int> host_of_rank;
  int hosts() const;
  std::vector<int> ranks_on(int host) const;  // ascending
  // From per-rank host keys: equal keys = same host.
  static HostPlacement from_keys(const std::vector<std::string>& keys);
};

class HostLane {
 public:
  // The host-local rail (reach: this host): point to point in job rank space, or collective among
  // this host's ranks (Rail::as_point_to_point / as_collective).
  virtual Rail& lane() = 0;
  // The network rail proper (reach: the job): the cross-host phase runs on it directly.
  virtual PointToPointRail& network() = 0;
  // The same on every rank; at least one host holds several ranks.
  virtual const HostPlacement& placement() const = 0;

 protected:
  ~HostLane() = default;  // owned by the rail that offers it, never deleted through this
};

}  // namespace nezha::transport
