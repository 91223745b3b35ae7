// Test-only in-memory Rail: N ranks in one process (one std::thread each), exchanging messages
// through mailboxes keyed by (src, dst). It keeps every promise of transport/rail.h that the
// algorithms can observe:
//  * messages are delivered in order per (src, dst); the receiver names the exact tag and size it
//    expects and anything else throws ProtocolError (naming peer and rail);
//  * waits end at the deadline with TimeoutError (naming peer and rail); a wait sleeps on a
//    condition variable, it never spins;
//  * after an error between two ranks their connection is closed: later calls between them throw
//    PeerError at once, and a rank blocked on the other wakes with PeerError;
//  * abort() poisons one rank's rail: its pending and future data calls throw NezhaError, and its
//    peers see PeerError, as a closed socket would show them.
// Sends are buffered without limit, so send never blocks and sendrecv is send-then-receive.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/rail.h"

namespace nezha::testing {

class MemoryWorld {
 public:
  explicit MemoryWorld(int size, std::string rail_name = "mem0")
      : size_(size),
        mailboxes_(static_cast<size_t>(size) * size),
        closed_(static_cast<size_t>(size) * size),
        aborted_(static_cast<size_t>(size)) {
    for (int r = 0; r < size; ++r) rails_.push_back(std::make_unique<RankRail>(*this, r, rail_name));
  }

  int size() const { return size_; }
  transport::Rail& rail(int rank) { return *rails_.at(static_cast<size_t>(rank)); }

  // What the rails report as send_buffer_bytes(): sends are never limited here, but a world can
  // claim 0 so that the algorithms take their unpipelined (lock-step) paths.
  void set_send_buffer_bytes(size_t bytes) { send_buffer_bytes_ = bytes; }

  // Messages sent but not yet received, over all mailboxes (a finished collective leaves none).
  size_t undelivered() {
    size_t total = 0;
    for (auto& box : mailboxes_) {
      std::lock_guard<std::mutex> lock(box.mu);
      total += box.queue.size();
    }
    return total;
  }

 private:
  size_t send_buffer_bytes_ = SIZE_MAX;

  struct Message {
    uint64_t tag;
    std::vector<uint8_t> data;
  };
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Message> queue;
  };

  class RankRail : public transport::Rail {
   public:
    RankRail(MemoryWorld& world, int rank, const std::string& name)
        : world_(world), rank_(rank) {
      props_.name = name;
      props_.local_addr = "memory";
      props_.protocol = "memory";
    }

    const transport::RailProperties& properties() const override { return props_; }
    int rank() const override { return rank_; }
    int size() const override { return world_.size_; }

    void send(int peer, uint64_t tag, const void* data, size_t bytes,
              const Deadline& deadline) override {
      check_usable(peer, "send to");
      Mailbox& box = world_.mailbox(rank_, peer);
      Message msg{tag, std::vector<uint8_t>(bytes)};
      if (bytes > 0) std::memcpy(msg.data.data(), data, bytes);
      {
        std::lock_guard<std::mutex> lock(box.mu);
        box.queue.push_back(std::move(msg));
      }
      box.cv.notify_all();
      bytes_sent_ += bytes;
    }

    void recv(int peer, uint64_t tag, void* data, size_t bytes,
              const Deadline& deadline) override {
      check_usable(peer, "recv from");
      Mailbox& box = world_.mailbox(peer, rank_);
      std::unique_lock<std::mutex> lock(box.mu);
      auto ready = [&] {
        return !box.queue.empty() || world_.aborted_[rank_] || world_.aborted_[peer] ||
               world_.is_closed(rank_, peer);
      };
      if (deadline.at() == Clock::time_point::max()) {
        box.cv.wait(lock, ready);
      } else if (!box.cv.wait_until(lock, deadline.at(), ready)) {
        lock.unlock();
        world_.close(rank_, peer);
        throw TimeoutError(peer, where("recv from", peer) + ": timed out waiting for tag " +
                                     std::to_string(tag) + " (" + std::to_string(bytes) +
                                     " bytes)");
      }
      if (world_.aborted_[rank_]) throw NezhaError(where("recv from", peer) + ": " + abort_reason());
      if (box.queue.empty()) {
        lock.unlock();
        throw PeerError(peer, where("recv from", peer) + ": connection closed");
      }
      Message msg = std::move(box.queue.front());
      box.queue.pop_front();
      lock.unlock();
      if (msg.tag != tag || msg.data.size() != bytes) {
        world_.close(rank_, peer);
        throw ProtocolError(where("recv from", peer) + ": expected tag " + std::to_string(tag) +
                            " with " + std::to_string(bytes) + " bytes, got tag " +
                            std::to_string(msg.tag) + " with " + std::to_string(msg.data.size()) +
                            " bytes");
      }
      if (bytes > 0) std::memcpy(data, msg.data.data(), bytes);
      bytes_received_ += bytes;
    }

    void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                       int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                       const Deadline& deadline) override {
      send(send_peer, send_tag, send_data, send_bytes, deadline);
      recv(recv_peer, recv_tag, recv_data, recv_bytes, deadline);
    }

    size_t send_buffer_bytes() const override { return world_.send_buffer_bytes_; }

    transport::RailCounters counters() const override {
      return {bytes_sent_.load(), bytes_received_.load()};
    }

    void abort(const std::string& reason) override {
      {
        std::lock_guard<std::mutex> lock(abort_mu_);
        abort_reason_ = reason;
      }
      world_.aborted_[rank_] = true;
      world_.wake_all();
    }

   private:
    std::string where(const char* verb, int peer) const {
      return "rail " + props_.name + ", rank " + std::to_string(rank_) + ": " + verb + " rank " +
             std::to_string(peer);
    }
    std::string abort_reason() const {
      std::lock_guard<std::mutex> lock(abort_mu_);
      return "rail aborted: " + abort_reason_;
    }
    void check_usable(int peer, const char* verb) const {
      if (peer < 0 || peer >= world_.size_ || peer == rank_) {
        throw InvalidArgument(where(verb, peer) + ": no such peer");
      }
      if (world_.aborted_[rank_]) throw NezhaError(where(verb, peer) + ": " + abort_reason());
      if (world_.aborted_[peer] || world_.is_closed(rank_, peer)) {
        throw PeerError(peer, where(verb, peer) + ": connection closed");
      }
    }

    MemoryWorld& world_;
    const int rank_;
    transport::RailProperties props_;
    std::atomic<uint64_t> bytes_sent_{0};
    std::atomic<uint64_t> bytes_received_{0};
    mutable std::mutex abort_mu_;
    std::string abort_reason_;
  };

  Mailbox& mailbox(int src, int dst) { return mailboxes_[static_cast<size_t>(src) * size_ + dst]; }

  bool is_closed(int a, int b) const { return closed_[static_cast<size_t>(a) * size_ + b]; }

  // A connection is one link between two ranks: closing it is seen from both ends.
  void close(int a, int b) {
    closed_[static_cast<size_t>(a) * size_ + b] = true;
    closed_[static_cast<size_t>(b) * size_ + a] = true;
    wake_all();
  }

  // Lock-then-notify so a waiter cannot miss the flag change between its check and its sleep.
  void wake_all() {
    for (auto& box : mailboxes_) {
      { std::lock_guard<std::mutex> lock(box.mu); }
      box.cv.notify_all();
    }
  }

  const int size_;
  std::vector<Mailbox> mailboxes_;
  std::vector<std::atomic<bool>> closed_;
  std::vector<std::atomic<bool>> aborted_;
  std::vector<std::unique_ptr<RankRail>> rails_;
};

}  // namespace nezha::testing
