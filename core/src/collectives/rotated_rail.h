// The rail's ranks renumbered from another rank, for the log-step and halving/doubling folds
// (private to core/src/collectives/).
//
// Where n is not a power of two, ranks p..n-1 of those algorithms (p: the largest power of two
// <= n) hand their input to a partner and wait for the result: the only ranks whose share lasts
// the whole operation. Their partners return as soon as their last send is in a socket buffer, and
// the others after the exchanges among p ranks. Rank 0 is the coordinator, whose cost models plan
// every operation from its own shares' times: run on the rail's numbering, it saw a third of what a
// 128 KB share takes on 6 hosts (0.58 ms where the extra ranks waited 2 ms), so its plans put too
// much on the rail that ran halving/doubling. Renumbered so that rank 0 is an extra rank, it times
// the whole operation. Every rank renumbers alike, so the fixed operand order that keeps results
// bit-identical on every rank is still one order.
#pragma once

#include "collectives/algorithm_util.h"
#include "transport/rail.h"

namespace nezha::collectives::detail {

class RotatedRail final : public transport::PointToPointRail {
 public:
  // Rank r of `rail` is rank (r - shift) mod n here.
  RotatedRail(transport::PointToPointRail& rail, int shift)
      : rail_(rail), n_(rail.size()), shift_(((shift % n_) + n_) % n_) {}

  const transport::RailProperties& properties() const override { return rail_.properties(); }
  int rank() const override { return (rail_.rank() - shift_ + n_) % n_; }
  int size() const override { return n_; }
  std::string local_address() const override { return rail_.local_address(); }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  transport::RailCounters counters() const override { return rail_.counters(); }
  void abort(const std::string& reason) override { rail_.abort(reason); }
  std::string link_fault() const override { return rail_.link_fault(); }
  bool delivering(std::chrono::milliseconds quiet) const override { return rail_.delivering(quiet); }
  bool reaches(int peer) const override { return rail_.reaches(real(peer)); }
  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override {
    rail_.send(real(peer), tag, data, bytes, deadline);
  }
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override {
    rail_.recv(real(peer), tag, data, bytes, deadline);
  }
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag, int recv_peer,
                     void* recv_data, size_t recv_bytes, uint64_t recv_tag, const Deadline& deadline) override {
    rail_.sendrecv_tags(real(send_peer), send_data, send_bytes, send_tag, real(recv_peer), recv_data, recv_bytes,
                        recv_tag, deadline);
  }
  size_t send_buffer_bytes() const override { return rail_.send_buffer_bytes(); }

 private:
  int real(int peer) const { return (peer + shift_) % n_; }

  transport::PointToPointRail& rail_;
  int n_;
  int shift_;
};

// The shift that makes rail rank 0 the first extra rank (p) of a fold over n ranks; 0 where n is a
// power of two (no fold).
inline int fold_shift(int n) { return n - largest_power_of_two_at_most(n); }

}  // namespace nezha::collectives::detail
