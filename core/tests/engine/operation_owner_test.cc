// The engine owns what an operation touches: TensorEntry::owner keeps the buffers alive while the
// operation is queued, negotiated, executed, failed or shut down, whether or not the caller kept the
// handle, and is released once the engine is done with it. Here the owner holds the only copy of the
// data, so a use after release is a use after free (reported by the ASan tier, make test-asan).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_cluster.h"

namespace nezha::engine {
namespace {

using testing::Cluster;
using testing::loopback_rails;
using testing::make_request;

struct Buffers {
  std::vector<float> in, out;
};

// Submits `req` with buffers only the entry owns; returns (the handle, a weak reference to them).
std::pair<std::shared_ptr<OpHandle>, std::weak_ptr<Buffers>> submit_owned(Engine& e, Request req,
                                                                          float value) {
  auto bufs = std::make_shared<Buffers>();
  const auto count = static_cast<size_t>(req.num_elements());
  bufs->in.assign(count, value);
  bufs->out.assign(count, -1);
  TensorEntry t;
  t.req = std::move(req);
  t.input = bufs->in.data();
  t.output = bufs->out.data();
  t.owner = bufs;
  std::weak_ptr<Buffers> weak = bufs;
  return {e.enqueue(std::move(t)), weak};
}

bool released_within(const std::weak_ptr<Buffers>& w, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!w.expired() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return w.expired();
}

TEST(OperationOwnerTest, KeptWhileInFlightWithoutAHandleAndReleasedWhenDone) {
  for (int rails : {1, 2}) {  // two rails: failover keeps shares in the ledger until trimmed
    Cluster c(2, loopback_rails(rails), [](EngineConfig& cfg) { cfg.control_inline_bytes = 0; });
    const int64_t n = 300000;  // several ring segments, split over both rails
    auto [dropped, weak0] =
        submit_owned(c[0], make_request(OpType::kAllreduce, "x", DataType::kFloat32, {n}), 1.0f);
    dropped.reset();  // the caller lets go of everything
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(weak0.expired()) << "released while rank 1 had not submitted yet";
    std::vector<float> in1(n, 2.0f), out1(n, 0);
    auto h1 = testing::submit(c[1], make_request(OpType::kAllreduce, "x", DataType::kFloat32, {n}),
                              in1.data(), out1.data());
    testing::expect_ok(h1, "rank 1");
    EXPECT_EQ(out1.front(), 3.0f);
    EXPECT_EQ(out1.back(), 3.0f);
    c.shutdown();
    EXPECT_TRUE(released_within(weak0, 5)) << rails << " rail(s): never released";
  }
}

TEST(OperationOwnerTest, ReleasedOnErrorsShutdownAndEveryCollective) {
  Cluster c(2, loopback_rails(2));
  std::vector<std::weak_ptr<Buffers>> owned;
  std::vector<std::shared_ptr<OpHandle>> h0, h1;
  auto both = [&](Request r0, Request r1) {
    auto [a, wa] = submit_owned(c[0], std::move(r0), 1.0f);
    auto [b, wb] = submit_owned(c[1], std::move(r1), 2.0f);
    h0.push_back(a);
    h1.push_back(b);
    owned.push_back(wa);
    owned.push_back(wb);
  };
  auto req = [](OpType t, const std::string& name, int64_t n) {
    Request r = make_request(t, name, DataType::kFloat32, {n});
    if (t == OpType::kBroadcast) r.root = 1;
    return r;
  };
  both(req(OpType::kAllreduce, "mismatch", 10), req(OpType::kAllreduce, "mismatch", 11));
  for (int i = 0; i < 3; ++i)  // fused
    both(req(OpType::kAllreduce, "fused." + std::to_string(i), 1000),
         req(OpType::kAllreduce, "fused." + std::to_string(i), 1000));
  both(req(OpType::kBroadcast, "bcast", 200000), req(OpType::kBroadcast, "bcast", 200000));
  both(req(OpType::kAllgather, "gather", 50000), req(OpType::kAllgather, "gather", 70000));
  both(req(OpType::kReducescatter, "rs", 100000), req(OpType::kReducescatter, "rs", 100000));
  for (size_t i = 0; i < h0.size(); ++i) {
    ASSERT_TRUE(h0[i]->wait_for(10));
    ASSERT_TRUE(h1[i]->wait_for(10));
    EXPECT_EQ(h0[i]->error().empty(), i != 0) << "operation " << i << ": " << h0[i]->error();
  }
  // Never matched by rank 0: still in flight at shutdown, failed by it.
  auto [lonely, weak_lonely] = submit_owned(c[1], req(OpType::kAllreduce, "only_rank_1", 64), 1.0f);
  owned.push_back(weak_lonely);
  h0.clear();
  h1.clear();
  c.shutdown();
  ASSERT_TRUE(lonely->wait_for(1));
  EXPECT_NE(lonely->error().find("shut down"), std::string::npos) << lonely->error();
  lonely.reset();
  for (size_t i = 0; i < owned.size(); ++i)
    EXPECT_TRUE(released_within(owned[i], 5)) << "owner " << i << " never released";
}

}  // namespace
}  // namespace nezha::engine
