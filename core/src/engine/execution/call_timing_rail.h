// CallTimingRail: a view of a point-to-point rail that times each receiving data call (recv and the
// exchanges), so the engine can tell the time a share spent waiting for a late peer from the time
// the rail took (multirail/share_timing.h).
//
// What it promises: everything rail.h promises, as the parent does it (same rank space, same
// errors); it owns nothing: connect() checks nothing and forms nothing, reset() and close() do
// nothing, abort() aborts the parent. It offers no host lane (a share run through it runs flat).
// Threads: as rail.h (data calls from the parent's one data thread); the parent and `calls` must
// outlive the view.
#pragma once

#include <string>
#include <vector>

#include "transport/rail.h"

namespace nezha::engine {

class CallTimingRail final : public transport::PointToPointRail {
 public:
  // Appends each receiving call's seconds to `calls`.
  CallTimingRail(transport::PointToPointRail& parent, std::vector<double>& calls)
      : parent_(parent), calls_(calls) {}

  const transport::RailProperties& properties() const override { return parent_.properties(); }
  int rank() const override { return parent_.rank(); }
  int size() const override { return parent_.size(); }
  std::string local_address() const override { return parent_.local_address(); }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  bool reaches(int peer) const override { return parent_.reaches(peer); }

  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override {
    parent_.send(peer, tag, data, bytes, deadline);
  }
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override;
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag, int recv_peer,
                     void* recv_data, size_t recv_bytes, uint64_t recv_tag, const Deadline& deadline) override;
  size_t send_buffer_bytes() const override { return parent_.send_buffer_bytes(); }
  transport::RailCounters counters() const override { return parent_.counters(); }
  void abort(const std::string& reason) override { parent_.abort(reason); }
  std::string link_fault() const override { return parent_.link_fault(); }
  bool delivering(std::chrono::milliseconds quiet) const override { return parent_.delivering(quiet); }

 private:
  transport::PointToPointRail& parent_;
  std::vector<double>& calls_;
};

}  // namespace nezha::engine
