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
// Lifecycle (rail.h): a world's rails start connected, so collective tests need no connect().
// local_address() holds a NUL and a non-ASCII byte on purpose, and connect() checks every peer's
// address byte for byte, so a rendezvous that mangles opaque addresses fails loudly. reset() drops
// this rank's links and queued messages and clears its abort; connect() re-opens them and waits
// (until the deadline) for every peer to have connected too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/rail.h"
#include "transport/rail_factory.h"

namespace nezha::testing {

class MemoryWorld {
 public:
  explicit MemoryWorld(int size, std::string rail_name = "mem0")
      : size_(size),
        mailboxes_(static_cast<size_t>(size) * size),
        closed_(static_cast<size_t>(size) * size),
        aborted_(static_cast<size_t>(size)),
        connected_(static_cast<size_t>(size)) {
    for (auto& c : connected_) c = true;
    for (int r = 0; r < size; ++r) rails_.push_back(std::make_unique<RankRail>(*this, r, rail_name));
  }

  int size() const { return size_; }
  transport::PointToPointRail& rail(int rank) { return *rails_.at(static_cast<size_t>(rank)); }

  // What the rails report as send_buffer_bytes(): sends are never limited here, but a world can
  // claim 0 so that the algorithms take their unpipelined (lock-step) paths.
  void set_send_buffer_bytes(size_t bytes) { send_buffer_bytes_ = bytes; }

  // A slower link: every send sleeps this many microseconds per KiB it carries (0: none). May change
  // while ranks send (a rail whose rate drops mid-operation).
  void set_send_pace(double us_per_kib) { send_us_per_kib_ = us_per_kib; }

  // A stalled link for data: while held, every send of at least `min_bytes` stops after queueing its
  // message until released (or the rail is aborted, or the send's deadline passes); smaller ones
  // (the algorithms' own coordination) go on. Unlike a pace, the release orders what the senders do
  // next after what the test did meanwhile (ThreadSanitizer sees the order).
  void hold_sends(bool hold, size_t min_bytes = 0) {
    {
      std::lock_guard<std::mutex> lock(hold_mu_);
      hold_min_bytes_ = min_bytes;
      held_ = hold;
    }
    hold_cv_.notify_all();
  }

  // Messages sent so far (any rank) of at least `lo` and less than `hi` bytes.
  uint64_t messages_sized(size_t lo, size_t hi) {
    std::lock_guard<std::mutex> lock(sizes_mu_);
    uint64_t n = 0;
    for (const auto& [bytes, count] : sent_sizes_)
      if (bytes >= lo && bytes < hi) n += count;
    return n;
  }

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
  std::atomic<double> send_us_per_kib_{0};
  std::atomic<bool> held_{false};  // written under hold_mu_; read without it on every send
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  size_t hold_min_bytes_ = 0;  // under hold_mu_

  void wait_while_held(int rank, size_t bytes, const Deadline& deadline) {
    if (!held_) return;
    std::unique_lock<std::mutex> lock(hold_mu_);
    if (bytes < hold_min_bytes_) return;
    auto released = [&] { return !held_ || aborted_[rank]; };
    if (deadline.at() == Clock::time_point::max())
      hold_cv_.wait(lock, released);
    else
      hold_cv_.wait_until(lock, deadline.at(), released);
  }
  std::mutex sizes_mu_;
  std::map<size_t, uint64_t> sent_sizes_;  // message size -> how many were sent

  void count_sent(size_t bytes) {
    std::lock_guard<std::mutex> lock(sizes_mu_);
    ++sent_sizes_[bytes];
  }

  struct Message {
    uint64_t tag;
    std::vector<uint8_t> data;
  };
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Message> queue;
  };

  // What rank's local_address() is: opaque bytes, NUL and 0xff included.
  static std::string address_of(int rank) {
    return std::string("mem\0\xff", 5) + std::to_string(rank);
  }

  class RankRail : public transport::PointToPointRail {
   public:
    RankRail(MemoryWorld& world, int rank, const std::string& name)
        : world_(world), rank_(rank) {
      props_.name = name;
      props_.local_addr = "memory";
      props_.kind = "memory";
    }

    const transport::RailProperties& properties() const override { return props_; }
    int rank() const override { return rank_; }
    int size() const override { return world_.size_; }

    std::string local_address() const override { return address_of(rank_); }

    void connect(const std::vector<std::string>& addresses, const Deadline& deadline) override {
      const int n = world_.size_;
      if (static_cast<int>(addresses.size()) != n)
        throw InvalidArgument("rail " + props_.name + ": connect() got " +
                              std::to_string(addresses.size()) + " addresses for " +
                              std::to_string(n) + " ranks");
      for (int p = 0; p < n; ++p)
        if (addresses[p] != address_of(p))
          throw ProtocolError("rail " + props_.name + ", rank " + std::to_string(rank_) +
                              ": rank " + std::to_string(p) + "'s address arrived altered (" +
                              std::to_string(addresses[p].size()) + " bytes)");
      for (int p = 0; p < n; ++p) world_.closed_[world_.link(rank_, p)] = false;
      world_.connected_[rank_] = true;
      world_.wake_all();
      std::unique_lock<std::mutex> lock(world_.connect_mu_);
      auto all = [&] {
        for (int p = 0; p < n; ++p)
          if (!world_.connected_[p]) return false;
        return true;
      };
      while (!all()) {
        if (world_.connect_cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout && !all()) {
          std::string missing;
          for (int p = 0; p < n; ++p)
            if (!world_.connected_[p]) missing += " " + std::to_string(p);
          throw NezhaError("rail " + props_.name + ", rank " + std::to_string(rank_) +
                           ": connect() timed out; ranks not connected:" + missing);
        }
      }
    }

    void reset() override {
      world_.connected_[rank_] = false;
      for (int p = 0; p < world_.size_; ++p) {
        if (p == rank_) continue;
        world_.close(rank_, p);
        world_.drain(rank_, p);
        world_.drain(p, rank_);
      }
      world_.aborted_[rank_] = false;
    }

    void close() override { abort("rail closed"); }

    bool reaches(int peer) const override {
      return peer >= 0 && peer < world_.size_ && peer != rank_ && world_.connected_[rank_] &&
             !world_.aborted_[rank_] && !world_.aborted_[peer] && !world_.is_closed(rank_, peer);
    }

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
      world_.count_sent(bytes);
      if (const double pace = world_.send_us_per_kib_; pace > 0)  // after queueing: the data leaves slowly
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(pace * bytes / 1024)));
      world_.wait_while_held(rank_, bytes, deadline);
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

  size_t link(int a, int b) const { return static_cast<size_t>(a) * size_ + b; }
  bool is_closed(int a, int b) const { return closed_[link(a, b)]; }

  void drain(int src, int dst) {
    Mailbox& box = mailbox(src, dst);
    std::lock_guard<std::mutex> lock(box.mu);
    box.queue.clear();
  }

  // A connection is one link between two ranks: closing it is seen from both ends.
  void close(int a, int b) {
    closed_[static_cast<size_t>(a) * size_ + b] = true;
    closed_[static_cast<size_t>(b) * size_ + a] = true;
    wake_all();
  }

  // Lock-then-notify so a waiter cannot miss the flag change between its check and its sleep.
  void wake_all() {
    { std::lock_guard<std::mutex> lock(connect_mu_); }
    connect_cv_.notify_all();
    { std::lock_guard<std::mutex> lock(hold_mu_); }
    hold_cv_.notify_all();
    for (auto& box : mailboxes_) {
      { std::lock_guard<std::mutex> lock(box.mu); }
      box.cv.notify_all();
    }
  }

  const int size_;
  std::vector<Mailbox> mailboxes_;
  std::vector<std::atomic<bool>> closed_;
  std::vector<std::atomic<bool>> aborted_;
  std::vector<std::atomic<bool>> connected_;  // false between reset() and connect()
  std::mutex connect_mu_;
  std::condition_variable connect_cv_;
  std::vector<std::unique_ptr<RankRail>> rails_;
};

}  // namespace nezha::testing

namespace nezha::testing {

// The "memory" rail kind for the factory (register_memory_rail_kind()): spec "memory;world=NAME"
// makes rank ctx.rank's rail of the MemoryWorld called NAME, created by the first rank that asks for
// it (with ctx.size ranks) and kept alive while any of its rails is. The rail forwards every call
// to the world's rail for that rank, so engines built from specs share one world.
// Option host_size=N makes it a host-local rail (RailReach::kHost) whose "hosts" are blocks of N
// consecutive ranks: it reaches only the ranks of its own block. Option hosts=3-1 does the same with
// blocks of the sizes given (uneven placements). Option fails_alone=0 says the rail cannot fail
// apart from the ranks (RailProperties::can_fail_alone), as a shared-memory rail says.
class MemoryWorldRail : public transport::PointToPointRail {
 public:
  MemoryWorldRail(std::shared_ptr<MemoryWorld> world, int rank, std::vector<int> host_of_rank,
                  bool can_fail_alone = true)
      : world_(std::move(world)), rail_(world_->rail(rank)), props_(rail_.properties()),
        host_of_rank_(std::move(host_of_rank)) {
    if (!host_of_rank_.empty()) props_.reach = transport::RailReach::kHost;
    props_.can_fail_alone = can_fail_alone;
  }
  std::string host_key(const std::string& address) const override {
    for (int p = 0; p < rail_.size(); ++p)
      if (!host_of_rank_.empty() && world_->rail(p).local_address() == address)
        return "host" + std::to_string(host_of_rank_[static_cast<size_t>(p)]);
    return {};
  }
  ~MemoryWorldRail() override { rail_.close(); }
  const transport::RailProperties& properties() const override { return props_; }
  int rank() const override { return rail_.rank(); }
  int size() const override { return rail_.size(); }
  std::string local_address() const override { return rail_.local_address(); }
  void connect(const std::vector<std::string>& a, const Deadline& d) override { rail_.connect(a, d); }
  void reset() override { rail_.reset(); }
  void close() override { rail_.close(); }
  bool reaches(int peer) const override {
    if (!host_of_rank_.empty() && (peer < 0 || peer >= rail_.size() ||
                                   host_of_rank_[static_cast<size_t>(peer)] != host_of_rank_[static_cast<size_t>(rail_.rank())]))
      return false;
    return rail_.reaches(peer);
  }
  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& d) override {
    rail_.send(peer, tag, data, bytes, d);
  }
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& d) override {
    rail_.recv(peer, tag, data, bytes, d);
  }
  void sendrecv_tags(int sp, const void* sd, size_t sb, uint64_t st, int rp, void* rd, size_t rb,
                     uint64_t rt, const Deadline& d) override {
    rail_.sendrecv_tags(sp, sd, sb, st, rp, rd, rb, rt, d);
  }
  size_t send_buffer_bytes() const override { return rail_.send_buffer_bytes(); }
  transport::RailCounters counters() const override { return rail_.counters(); }
  void abort(const std::string& reason) override { rail_.abort(reason); }

 private:
  std::shared_ptr<MemoryWorld> world_;
  transport::PointToPointRail& rail_;
  transport::RailProperties props_;
  std::vector<int> host_of_rank_;  // empty: reach the job
};

// The worlds the factory made, by "<world option>/<rail index>" (tests reach a world through it).
struct MemoryWorldRegistry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<MemoryWorld>> worlds;
  static MemoryWorldRegistry& get() {
    static MemoryWorldRegistry registry;
    return registry;
  }
};

// The world behind the rails of option world=`name` at index `rail_index`, null if none is alive.
inline std::shared_ptr<MemoryWorld> find_memory_world(const std::string& name, int rail_index) {
  MemoryWorldRegistry& reg = MemoryWorldRegistry::get();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.worlds.find(name + "/" + std::to_string(rail_index));
  return it == reg.worlds.end() ? nullptr : it->second.lock();
}

inline std::unique_ptr<transport::Rail> make_memory_rail(const transport::RailSpec& spec,
                                                         const transport::RailContext& ctx) {
  transport::reject_unknown_options(spec, {"world", "host_size", "hosts", "fails_alone"});
  auto it = spec.options.find("world");
  if (it == spec.options.end()) throw InvalidArgument("rail '" + spec.name + "': kind memory needs world=NAME");
  MemoryWorldRegistry& reg = MemoryWorldRegistry::get();
  std::shared_ptr<MemoryWorld> world;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    world = reg.worlds[it->second + "/" + std::to_string(ctx.rail_index)].lock();
    if (!world) {
      world = std::make_shared<MemoryWorld>(ctx.size, spec.name);
      reg.worlds[it->second + "/" + std::to_string(ctx.rail_index)] = world;
    }
  }
  if (world->size() != ctx.size)
    throw InvalidArgument("memory world " + it->second + " has " + std::to_string(world->size()) +
                          " ranks, not " + std::to_string(ctx.size));
  std::vector<int> host_of_rank;
  const int host_size = static_cast<int>(transport::rail_option_bytes(spec, "host_size", 0));
  if (host_size > 0)
    for (int r = 0; r < ctx.size; ++r) host_of_rank.push_back(r / host_size);
  auto hosts = spec.options.find("hosts");
  if (hosts != spec.options.end()) {  // "3-1": block sizes
    std::string text = hosts->second;
    for (size_t pos = 0, h = 0; pos <= text.size(); ++h) {
      size_t dash = text.find('-', pos);
      if (dash == std::string::npos) dash = text.size();
      const int n = std::stoi(text.substr(pos, dash - pos));
      for (int i = 0; i < n; ++i) host_of_rank.push_back(static_cast<int>(h));
      pos = dash + 1;
    }
    if (static_cast<int>(host_of_rank.size()) != ctx.size)
      throw InvalidArgument("memory rail hosts=" + text + " does not add up to " + std::to_string(ctx.size));
  }
  const bool fails_alone = transport::rail_option_bytes(spec, "fails_alone", 1) != 0;
  return std::make_unique<MemoryWorldRail>(world, ctx.rank, std::move(host_of_rank), fails_alone);
}

// Registers kind "memory" once per process: the one row a transport needs. Its target is none
// ("memory;world=W"): the world option names which in-process ranks meet.
inline void register_memory_rail_kind() {
  static std::once_flag once;
  std::call_once(once, [] {
    transport::register_rail_kind({"memory", &make_memory_rail, transport::RailTarget::kNone});
  });
}

}  // namespace nezha::testing
