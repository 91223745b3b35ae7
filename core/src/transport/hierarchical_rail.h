// HierarchicalRail: a network rail (reach: the job) paired with a host lane (a kHost rail of shared
// memory: point to point, or collective) for the hierarchical allreduce (host_lane.h).
//
// What it is for. Where several ranks share a host, an allreduce share of a network rail moves less
// over the network if the ranks of each host first reduce-scatter it among themselves over shared
// memory, then only the slice owners allreduce across hosts, then each host allgathers. Each network
// rail gets its own lane (its own segments), so the rails' workers never share one: rails stay
// independent, as rail.h wants. To the engine this is one point-to-point rail: every data call of the
// contract goes to the network rail (broadcasts, allgathers, ... run flat), its lifecycle is both
// rails' (one opaque address carrying both, connect, reset, close and abort of both), and host_lane()
// offers the pair to the executor's allreduces. So failover, probes and re-admission need nothing
// new: a rail cut mid-operation fails the share on this rail, and its redo on a surviving one runs
// the same algorithm.
//
// Placement. connect() learns every rank's host from the lanes' addresses (Rail::host_key), the same
// on every rank; host_lane() is non-null where the placement has a host with several ranks (one
// host, or several).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/host_lane.h"
#include "transport/rail.h"

namespace nezha::transport {

class HierarchicalRail final : public PointToPointRail, private HostLane {
 public:
  // Throws InvalidArgument naming both unless `network` is a point-to-point rail reaching the job
  // and `host_lane` a rail reaching one host (point to point or collective).
  HierarchicalRail(std::unique_ptr<Rail> network, std::unique_ptr<Rail> host_lane);
  ~HierarchicalRail() override;

  // The network rail's, with kind "<network kind>+<lane kind>".
  const RailProperties& properties() const override { return properties_; }
  int rank() const override { return network_->rank(); }
  int size() const override { return network_->size(); }

  std::string local_address() const override;  // both rails' addresses, length-prefixed
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override;
  void close() override;
  bool reaches(int peer) const override { return network_->reaches(peer); }

  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override {
    network_->send(peer, tag, data, bytes, deadline);
  }
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override {
    network_->recv(peer, tag, data, bytes, deadline);
  }
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                     int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                     const Deadline& deadline) override {
    network_->sendrecv_tags(send_peer, send_data, send_bytes, send_tag, recv_peer, recv_data, recv_bytes,
                            recv_tag, deadline);
  }
  size_t send_buffer_bytes() const override { return network_->send_buffer_bytes(); }
  RailCounters counters() const override;  // both rails' bytes (the watchdog sees lane progress)
  std::string link_fault() const override { return network_->link_fault(); }
  // The network's connections: while the ranks work over the host lane they have nothing in
  // flight, so a silence there is a late or starved peer unless the network leaves data unacked.
  bool delivering(std::chrono::milliseconds quiet) const override { return network_->delivering(quiet); }
  void abort(const std::string& reason) override;

  // After connect(): this rail as a HostLane where some host holds several ranks, else null.
  HostLane* host_lane() override { return hierarchical_ ? this : nullptr; }

 private:
  Rail& lane() override { return *lane_; }
  PointToPointRail& network() override { return *network_; }
  const HostPlacement& placement() const override { return placement_; }

  std::unique_ptr<Rail> network_owner_, lane_owner_;
  PointToPointRail* network_;  // network_owner_ as the point-to-point rail it is
  Rail* lane_;                 // lane_owner_
  RailProperties properties_;
  HostPlacement placement_;
  bool hierarchical_ = false;
};

// Splits what HierarchicalRail::local_address() packed; InvalidArgument naming `who` if malformed.
void split_hierarchical_address(const std::string& packed, const std::string& who, std::string& network,
                                std::string& lane);

}  // namespace nezha::transport
