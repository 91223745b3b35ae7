// GroupRail: a point-to-point rail restricted to a group of the job's ranks, in the group's own rank space.
//
// What it is for. Collective algorithms run on "every rank of the rail" (rank() and size()). To run
// one among a subset of ranks (the ranks of one host inside the hierarchical allreduce, the owners of
// one slice across hosts, later a process set), wrap the connected rail in a view whose rank i is
// job rank members[i]: the algorithm is unchanged and its messages go over the parent's connections.
//
// What it promises. Everything rail.h promises, with peers numbered in the group (0 .. members-1);
// errors are the parent's, which name job ranks. The view owns nothing: the parent's lifecycle is
// the parent's. connect() only checks that the parent reaches every member (it forms no
// connection); reset() and close() do nothing; abort() aborts the parent (a view shares its fate:
// the parent's connections are what it uses). counters() are the parent's. It offers no host lane:
// an allreduce among a group runs flat.
//
// Threads. As rail.h: data calls from the parent's one data thread (a view adds no threads); the
// parent must outlive the view.
#pragma once

#include <string>
#include <vector>

#include "transport/rail.h"

namespace nezha::transport {

class GroupRail final : public PointToPointRail {
 public:
  // members: job ranks, distinct, in group-rank order; the parent's rank must be one of them.
  // Throws InvalidArgument otherwise (naming the rail and the ranks).
  GroupRail(PointToPointRail& parent, std::vector<int> members);

  const RailProperties& properties() const override { return parent_.properties(); }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int job_rank(int group_rank) const { return members_.at(static_cast<size_t>(group_rank)); }
  const std::vector<int>& members() const { return members_; }

  std::string local_address() const override { return parent_.local_address(); }
  // addresses are ignored (the parent is connected already); throws NezhaError naming the members
  // the parent does not reach.
  void connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) override;
  void reset() override {}
  void close() override {}
  bool reaches(int peer) const override;

  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override;
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override;
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                     int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                     const Deadline& deadline) override;
  size_t send_buffer_bytes() const override { return parent_.send_buffer_bytes(); }
  RailCounters counters() const override { return parent_.counters(); }
  void abort(const std::string& reason) override { parent_.abort(reason); }

 private:
  int to_job(int peer, const char* verb) const;  // InvalidArgument for a peer outside the group

  PointToPointRail& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace nezha::transport
