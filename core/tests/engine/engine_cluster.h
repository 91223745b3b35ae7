// Test helper: a job of Engine objects, ranks as threads in one process on loopback, and small
// request builders. Shared by the engine's end-to-end tests.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/memory_rail.h"
#include "engine/engine.h"
#include "transport/tcp_mesh.h"

namespace nezha::engine::testing {

inline std::vector<RailConfig> loopback_rails(int n) {
  std::vector<RailConfig> rails;
  for (int i = 0; i < n; ++i) rails.push_back({n == 1 ? "lo" : std::string(1, 'a' + i), "127.0.0.1"});
  return rails;
}

// `n` in-memory rails (test rail kind "memory", registered here), each its own fresh world; the
// engine builds them through the rail factory as it builds TCP rails. `extra_option` (e.g.
// "host_size=2") is added to every rail's options.
inline std::vector<RailConfig> memory_rails(int n, const std::string& extra_option = "") {
  nezha::testing::register_memory_rail_kind();
  static std::atomic<int> worlds{0};
  std::vector<RailConfig> rails;
  for (int i = 0; i < n; ++i) {
    RailConfig rc;
    rc.name = "mem" + std::to_string(i);
    rc.kind = "memory";
    rc.options["world"] = "engine-world-" + std::to_string(worlds++);
    if (!extra_option.empty()) {
      const size_t eq = extra_option.find('=');
      rc.options[extra_option.substr(0, eq)] = extra_option.substr(eq + 1);
    }
    rails.push_back(rc);
  }
  return rails;
}

// A job of `size` engines connected over loopback; `tweak` adjusts each rank's config.
class Cluster {
 public:
  explicit Cluster(int size, std::vector<RailConfig> rails = loopback_rails(1),
                   const std::function<void(EngineConfig&)>& tweak = {}) {
    std::vector<std::vector<std::string>> addrs(size);
    for (int r = 0; r < size; ++r) {
      EngineConfig c;
      c.rank = r;
      c.size = size;
      c.local_rank = r;
      c.local_size = size;
      c.rails = rails;
      c.secret = "engine-test-secret";
      c.timeout_s = 5;
      c.connect_timeout_s = 10;
      c.cycle_time_ms = 1;
      c.socket_buffer_bytes = 1 << 20;
      if (tweak) tweak(c);
      engines_.push_back(std::make_unique<Engine>(c));
      addrs[r] = engines_.back()->listen_addresses();  // shared, as a rendezvous store would
    }
    transport::testing::run_ranks(size, [&](int r) { engines_[r]->connect_and_start(addrs); });
  }

  ~Cluster() { shutdown(); }

  int size() const { return static_cast<int>(engines_.size()); }
  Engine& operator[](int r) { return *engines_[r]; }

  // Shuts every rank down concurrently (as separate processes would) and returns the seconds taken.
  double shutdown() {
    if (stopped_) return 0;
    stopped_ = true;
    auto start = std::chrono::steady_clock::now();
    transport::testing::run_ranks(size(), [&](int r) { engines_[r]->shutdown(); });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
  bool stopped_ = false;
};

// The world behind memory rail `rail` of a job built with memory_rails() (to pace or break it).
inline std::shared_ptr<nezha::testing::MemoryWorld> memory_world(const std::vector<RailConfig>& rails, int rail) {
  auto world = nezha::testing::find_memory_world(rails[rail].options.at("world"), rail);
  EXPECT_TRUE(world) << "rail " << rail;
  return world;
}

// Bytes each rank of `c` has sent on `rail` so far.
inline std::vector<uint64_t> bytes_sent(Cluster& c, int rail) {
  std::vector<uint64_t> out;
  for (int r = 0; r < c.size(); ++r) out.push_back(c[r].rail_stats()[rail].bytes_sent);
  return out;
}

// Whether every rank of `c` sees `rail` up within 15 s (re-admitted after a failure).
inline bool wait_all_up(Cluster& c, int rail) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < until) {
    bool up = true;
    for (int r = 0; r < c.size(); ++r) up = up && c[r].rail_stats()[rail].state == "up";
    if (up) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

inline Request make_request(OpType type, const std::string& name, DataType dtype,
                            std::vector<int64_t> shape, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.type = type;
  r.name = name;
  r.dtype = dtype;
  r.shape = std::move(shape);
  r.op = op;
  return r;
}

inline std::shared_ptr<OpHandle> submit(Engine& e, Request req, const void* in, void* out) {
  TensorEntry t;
  t.req = std::move(req);
  t.input = in;
  t.output = out;
  return e.enqueue(std::move(t));
}

// As submit(), through enqueue_all: lead_s and waits_to_end as there (a synchronous Python call
// leads and waits to the end).
inline std::shared_ptr<OpHandle> submit_leading(Engine& e, Request req, const void* in, void* out, double lead_s,
                                                bool waits_to_end = false) {
  TensorEntry t;
  t.req = std::move(req);
  t.input = in;
  t.output = out;
  std::vector<TensorEntry> one;
  one.push_back(std::move(t));
  return e.enqueue_all(std::move(one), lead_s, waits_to_end).at(0);
}

inline void expect_ok(const std::shared_ptr<OpHandle>& h, const std::string& what, double wait_s = 10) {
  ASSERT_TRUE(h->wait_for(wait_s)) << what << ": not done within " << wait_s << " s";
  EXPECT_EQ(h->error(), "") << what;
}

// Allreduces `count` floats on every rank of `c` (integer-valued, so any summation order is exact)
// and checks every rank's result against the sum computed here.
inline void allreduce_and_check(Cluster& c, const std::string& name, size_t count) {
  const int n = c.size();
  std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(count, -1));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<float>((i * 3 + r * 11) % 17);
  std::vector<std::shared_ptr<OpHandle>> h(n);
  for (int r = 0; r < n; ++r)
    h[r] = submit(c[r], make_request(OpType::kAllreduce, name, DataType::kFloat32, {static_cast<int64_t>(count)}),
                  in[r].data(), out[r].data());
  for (int r = 0; r < n; ++r) {
    // Late is a failure, but the buffers stay alive (and unread) until the engine is done with them.
    if (h[r]->wait_for(10)) continue;
    ADD_FAILURE() << name << ": rank " << r << " not done within 10 s";
    ASSERT_TRUE(h[r]->wait_for(120)) << name << ": rank " << r << " still not done after 130 s";
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(h[r]->error(), "") << name << ": rank " << r;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += in[q][i];
      ASSERT_EQ(out[r][i], want) << name << " rank " << r << " [" << i << "]";
    }
}

}  // namespace nezha::engine::testing
