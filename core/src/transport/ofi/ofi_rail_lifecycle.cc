// The ofi rail's lifecycle: the authenticated handshake and connect(), reset() (with the drain of the
// epoch it leaves) and close(). The data path is in ofi_rail.cc; the design in ofi_rail.h.
#ifdef NEZHA_WITH_OFI
#include <arpa/inet.h>
#include <unistd.h>

#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "transport/ofi/ofi_address.h"
#include "transport/ofi/ofi_endpoint.h"
#include "transport/ofi/ofi_rail.h"
#include "transport/ofi/ofi_rail_internal.h"

namespace nezha::transport {

using namespace ofi_detail;

void OfiRail::send_small(int peer, uint64_t wire_tag, const std::string& payload, const Deadline& deadline) {
  Stream s(false, peer, wire_tag, wire_tag, const_cast<char*>(payload.data()), payload.size(), 0, /*exact=*/false);
  Lock lk(fab_mu_);
  transfer(lk, &s, nullptr, deadline);
}

std::string OfiRail::recv_small(int peer, uint64_t wire_tag, size_t max_bytes, const Deadline& deadline) {
  std::string buf(max_bytes, '\0');
  Stream s(true, peer, wire_tag, wire_tag, buf.data(), max_bytes, 0, /*exact=*/false);
  {
    Lock lk(fab_mu_);
    transfer(lk, nullptr, &s, deadline);
  }
  buf.resize(s.received);
  return buf;
}

void OfiRail::handshake(int peer, const Deadline& deadline) {
  const Deadline step = earlier(deadline, Deadline::after_seconds(config_.handshake_timeout_s));
  const HandshakeParams params{config_.secret, rank_, size_, config_.rail_index};
  auto tag = [&](uint64_t n) { return kHandshakeBit | ((epoch_ & kEpochMask) << kEpochShift) | n; };
  auto expect = [&](uint64_t n, std::initializer_list<FrameType> types) {
    const std::string m = recv_small(peer, tag(n), kHandshakeMessageBytes, step);
    const FrameType type = m.empty() ? FrameType{} : static_cast<FrameType>(m[0]);
    if (std::find(types.begin(), types.end(), type) == types.end())
      throw ProtocolError(std::string("got a ") + frame_type_name(type) + " message where a " +
                          frame_type_name(*types.begin()) + " was expected");
    return std::make_pair(type, m.substr(1));
  };
  auto refuse = [&](uint64_t n) {  // tell the peer why we hang up, so its error names the problem too
    try {
      send_small(peer, tag(n), typed(FrameType::kAuthResult, auth_result_payload(false)),
                 earlier(deadline, Deadline::after_seconds(0.5)));
    } catch (const NezhaError&) {
    }
  };
  if (rank_ > peer) {  // connector
    ConnectorHandshake hs(params, peer);
    send_small(peer, tag(1), typed(FrameType::kHello, hs.hello()), step);
    std::string response;
    try {
      response = hs.on_challenge(expect(2, {FrameType::kChallenge}).second);
    } catch (const AuthenticationError&) {
      refuse(3);
      throw;
    }
    send_small(peer, tag(3), typed(FrameType::kAuthResponse, response), step);
    hs.on_result(expect(4, {FrameType::kAuthResult}).second);
  } else {  // acceptor
    AcceptorHandshake hs(params);
    const std::string challenge = hs.on_hello(expect(1, {FrameType::kHello}).second);
    if (hs.peer_rank() != peer)
      throw AuthenticationError("hello from the address of rank " + std::to_string(peer) + " claims rank " +
                                std::to_string(hs.peer_rank()));
    send_small(peer, tag(2), typed(FrameType::kChallenge, challenge), step);
    try {
      const auto [type, payload] = expect(3, {FrameType::kAuthResponse, FrameType::kAuthResult});
      hs.on_response(handshake_message(type), payload);
    } catch (const AuthenticationError&) {
      refuse(4);
      throw;
    }
    send_small(peer, tag(4), typed(FrameType::kAuthResult, auth_result_payload(true)), step);
  }
}

void OfiRail::connect(const std::vector<std::string>& addresses_by_rank, const Deadline& deadline) {
  if (static_cast<int>(addresses_by_rank.size()) != size_)
    throw InvalidArgument("rail " + config_.name + ": connect() got " + std::to_string(addresses_by_rank.size()) +
                          " addresses for " + std::to_string(size_) + " ranks");
  throw_if_aborted();
  Lock lk(fab_mu_);
  if (!endpoint_) throw NezhaError("rail " + config_.name + " is closed");
  std::vector<std::string> failures;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || (peer_addr_[peer] != FI_ADDR_UNSPEC && peer_raw_[peer] == addresses_by_rank[peer]))
      continue;
    try {
      const ofi::OfiAddress a = ofi::decode_address(addresses_by_rank[peer], peer, config_.name);
      if (a.provider != endpoint_->provider_name())
        throw ProtocolError("rank " + std::to_string(peer) + " opened provider '" + a.provider + "', rank " +
                            std::to_string(rank_) + " opened '" + endpoint_->provider_name() + "'");
      endpoint_->remove_address(peer_addr_[peer]);  // a peer that came back at a new address
      peer_addr_[peer] = endpoint_->insert_address(a.raw, peer);
      peer_raw_[peer] = addresses_by_rank[peer];
    } catch (const NezhaError& e) {
      close_peer(peer, e.what());
      failures.push_back(e.what());
    }
  }
  // Every rank walks its pairs in the same global order (lower rank first), so no cycle of waits.
  // The handshake's transfers take the lock themselves.
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !closed_reason_[peer].empty() || reachable_[peer]) continue;
    lk.unlock();
    try {
      handshake(peer, deadline);
      lk.lock();
      reachable_[peer].store(true, std::memory_order_release);
    } catch (const NezhaError& e) {
      lk.lock();
      throw_if_aborted();
      const std::string why = "handshake with rank " + std::to_string(peer) + " failed: " + e.what();
      close_peer(peer, why);
      failures.push_back(why);
    }
  }
  if (!failures.empty()) {
    std::ostringstream msg;
    msg << "rail " << config_.name << ": rank " << rank_ << " could not connect to all ranks: ";
    for (size_t i = 0; i < failures.size(); ++i) msg << (i ? "; " : "") << failures[i];
    throw NezhaError(msg.str());
  }
}

void OfiRail::reset() {
  Lock lk(fab_mu_);
  if (!endpoint_) return;
  Driving driving(this);  // the progress thread stays off the completion queue while this drains it
  for (Op& op : ops_) {
    if (!op.busy) continue;
    if (op.owner && !op.is_recv) ++detached_sends_;
    op.owner = nullptr;
    if (op.is_recv) endpoint_->cancel(&op.context);
  }
  // The address vector keeps its entries: re-admission connects to the same addresses, the epoch
  // keeps a straggler of the old mesh from matching, and the providers re-form a broken connection
  // on the next send (removing and re-inserting confuses the shm provider's directed receives).
  for (int peer = 0; peer < size_; ++peer) {
    reachable_[peer].store(false, std::memory_order_release);
    closed_reason_[peer].clear();
  }
  uint64_t drained;
  while (::read(abort_fd_, &drained, sizeof drained) > 0) {
  }
  drain_stale_epoch(lk);
  // Reap what the cancellations and dropped connections complete, so the slots come back.
  const Deadline drain = Deadline::after_seconds(0.5);
  while (free_slots_.size() < ops_.size() && !drain.expired()) reap(lk, drain, /*block=*/true);
  if (free_slots_.size() < ops_.size())  // normal while a cable is out: a later reset drains them
    NZ_LOG(Debug) << "rail " << config_.name << ": " << ops_.size() - free_slots_.size()
                  << " staging slots still held by the provider after reset (sends a peer has not taken yet)";
  epoch_ = (epoch_ + 1) & kEpochMask;
  std::lock_guard<std::mutex> lock(mu_);
  abort_reason_.clear();
  aborted_.store(false, std::memory_order_release);
}

void OfiRail::drain_stale_epoch(Lock& lk) {
  // Every epoch but the one reset() is about to enter: a send can be stuck from several resets back
  // (each failed probe while a cable is out is one). Tag matching takes one value and an ignore mask,
  // so the complement of one 6-bit epoch is 6 patterns: pattern b keeps the new epoch's bits above b,
  // flips bit b and ignores the bits below it.
  const uint64_t next_epoch = (epoch_ + 1) & kEpochMask;
  const uint64_t outside_epoch = ~(kEpochMask << kEpochShift);  // handshakes and data alike
  const Deadline give_up = Deadline::after_seconds(1);
  auto posting = [&] {
    for (int b = 0; b < kEpochBits && !free_slots_.empty(); ++b) {
      if (drain_patterns_posted_ & (1u << b)) continue;
      const uint64_t below = (uint64_t{1} << b) - 1;
      const uint64_t tag = ((next_epoch ^ (uint64_t{1} << b)) & ~below) << kEpochShift;
      const uint64_t ignore = outside_epoch | (below << kEpochShift);
      const size_t slot = free_slots_.back();
      Op& op = ops_[slot];
      if (endpoint_->post_recv(slot, config_.chunk_bytes, FI_ADDR_UNSPEC, tag, ignore, &op.context) != 0) return;
      free_slots_.pop_back();
      op.busy = true;
      op.owner = nullptr;
      op.is_recv = true;
      op.drain_pattern = b;
      op.peer = -1;
      op.bytes = config_.chunk_bytes;
      drain_patterns_posted_ |= 1u << b;
    }
  };
  last_drained_ = Clock::now();
  // Settled: our own sends are all complete and nothing stale arrived for a moment (peers reset
  // together, within milliseconds; a peer that is gone keeps ours pending until give_up, and the
  // next reset's drain gets another chance at them).
  while (!give_up.expired() &&
         (sends_busy_ > 0 || Clock::now() - last_drained_ < std::chrono::milliseconds(100))) {
    posting();
    reap(lk, earlier(give_up, Deadline::after_seconds(0.02)), /*block=*/true);
  }
  for (Op& op : ops_)
    if (op.busy && op.drain_pattern >= 0) endpoint_->cancel(&op.context);
}

void OfiRail::close() {
  abort("rail closed");
  stop_progress();
  for (int peer = 0; peer < size_; ++peer) reachable_[peer].store(false, std::memory_order_release);
  Lock lk(fab_mu_);
  if (endpoint_) {
    // Closing an rxm endpoint while operations are still posted on a connection a cut broke
    // crashed libfabric 1.17 in fi_close (a rail shut down right after a cable came back). So first
    // cancel the receives and take what completes, as reset() does, for a bounded time; the sends
    // a gone peer never takes are left for the close to discard.
    for (Op& op : ops_)
      if (op.busy && op.is_recv) endpoint_->cancel(&op.context);
    uint64_t drained;
    while (::read(abort_fd_, &drained, sizeof drained) > 0) {
    }
    const Deadline drain = Deadline::after_seconds(kCloseDrainS);
    while (free_slots_.size() < ops_.size() && !drain.expired()) reap(lk, drain, /*block=*/true);
  }
  endpoint_.reset();  // closing the endpoint discards whatever is still posted
}

}  // namespace nezha::transport
#endif  // NEZHA_WITH_OFI
