// ShmCollRail's broadcast, allgather, reducescatter and alltoall with ranks as threads of one process, against
// references computed here: every root, sizes not divisible by the chunk or the ranks, the slot ring
// wrapping, unequal per-rank sizes (zeros included), in place; every dtype x op of a reducescatter
// against the serial rank-order reduction, bit for bit; alltoalls of ragged byte matrices; the operations interleaved on one rail;
// a mismatched operation refused on every rank naming the rank; a rank behind named at the deadline;
// and a collective rail that runs none of them (the aggregation rail) saying so.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "common/error.h"
#include "rank_threads.h"
#include "reduce_reference.h"
#include "transport/agg/agg_rail.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {
namespace {

using testing::first_difference;
using testing::input_of;
using testing::reference;
using testing::run_ranks;

using Mesh = std::vector<std::unique_ptr<ShmCollRail>>;

// Small chunks and two slots, so that a few KB take several steps and wrap the slots. threads > 1:
// helper threads that cut every copy and reduction into pieces of a cache line or more.
Mesh make_mesh(int n, int threads = 1) {
  ShmCollRailConfig c;
  c.threads = threads;
  c.thread_min_bytes = 64;
  c.name = "shmcoll-ops";
  c.secret = "shmcoll-ops-secret";
  c.reduce_into = &collectives::reduce_into;
  c.chunk_bytes = 4096;
  c.slots = 2;
  c.small_bytes = 512;
  c.liveness_slice_ms = 20;
  Mesh rails;
  for (int r = 0; r < n; ++r) rails.push_back(std::make_unique<ShmCollRail>(c, r, n));
  std::vector<std::string> addrs;
  for (const auto& r : rails) addrs.push_back(r->local_address());
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  return rails;
}

std::vector<uint8_t> bytes_of(int rank, size_t n, uint64_t salt) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i * 131 + static_cast<size_t>(rank) * 17 + salt) % 251);
  return out;
}

Deadline soon() { return Deadline::after_seconds(20); }

void check_broadcast(Mesh& rails, size_t bytes, int root, uint64_t seq) {
  const int n = static_cast<int>(rails.size());
  const std::vector<uint8_t> want = bytes_of(root, bytes, seq);
  std::vector<std::vector<uint8_t>> bufs(n);
  run_ranks(n, [&](int r) {
    bufs[r] = r == root ? want : std::vector<uint8_t>(bytes, 0xee);
    rails[r]->start_broadcast(bufs[r].data(), bytes, root, seq)->wait(soon());
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(first_difference(bufs[r], want), "") << bytes << " bytes from root " << root << ", rank " << r;
}

TEST(ShmCollOps, BroadcastFromEveryRootMatchesTheRoot) {
  for (int n : {1, 2, 3, 4}) {
    auto rails = make_mesh(n);
    uint64_t seq = 0;
    for (int root = 0; root < n; ++root)
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{4093}, size_t{4096 * 5 + 17}})
        check_broadcast(rails, bytes, root, ++seq);
  }
}

// Rank r contributes sizes[r] bytes; every rank's output is the concatenation.
void check_allgather(Mesh& rails, const std::vector<size_t>& sizes, bool in_place, uint64_t seq) {
  const int n = static_cast<int>(rails.size());
  std::vector<size_t> offset(n + 1, 0);
  for (int r = 0; r < n; ++r) offset[r + 1] = offset[r] + sizes[r];
  std::vector<uint8_t> want;
  for (int r = 0; r < n; ++r) {
    const auto block = bytes_of(r, sizes[r], seq);
    want.insert(want.end(), block.begin(), block.end());
  }
  std::vector<std::vector<uint8_t>> outs(n);
  run_ranks(n, [&](int r) {
    outs[r].assign(offset[n], 0xee);
    std::vector<uint8_t*> blocks(n);
    for (int i = 0; i < n; ++i) blocks[i] = outs[r].data() + offset[i];
    std::vector<uint8_t> own = bytes_of(r, sizes[r], seq);
    const void* in = own.data();
    if (in_place) {
      std::copy(own.begin(), own.end(), blocks[r]);
      in = blocks[r];
    }
    rails[r]->start_allgather(in, blocks, sizes, seq)->wait(soon());
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(first_difference(outs[r], want), "") << "rank " << r << (in_place ? " in place" : "");
}

TEST(ShmCollOps, AllgatherOfUnequalBlocksMatchesTheConcatenation) {
  for (int n : {1, 2, 3, 4}) {
    auto rails = make_mesh(n);
    uint64_t seq = 0;
    std::vector<size_t> equal(n, 4096 * 3 + 5), ragged(n), zeros(n, 0);
    for (int r = 0; r < n; ++r) ragged[r] = (r % 2 == 0) ? 9000 + 7 * r : static_cast<size_t>(r * 3);
    for (bool in_place : {false, true})
      for (const auto* sizes : {&equal, &ragged, &zeros}) check_allgather(rails, *sizes, in_place, ++seq);
  }
}

// Block r of counts[r] elements is reduced onto rank r: against the serial rank-order reduction.
void check_reducescatter(Mesh& rails, DataType t, ReduceOp op, const std::vector<size_t>& counts, uint64_t seq) {
  const int n = static_cast<int>(rails.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0}), esize = dtype_size(t);
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(input_of(t, r, total));
  const std::vector<uint8_t> whole = reference(t, inputs, total, op);
  std::vector<std::vector<uint8_t>> outs(n);
  run_ranks(n, [&](int r) {
    outs[r].assign(counts[r] * esize, 0xee);
    std::vector<const uint8_t*> blocks(n);
    size_t at = 0;
    for (int i = 0; i < n; ++i, at += counts[i - 1]) blocks[i] = inputs[r].data() + at * esize;
    rails[r]->start_reducescatter(blocks, outs[r].data(), counts, t, op, seq)->wait(soon());
  });
  size_t at = 0;
  for (int r = 0; r < n; at += counts[r], ++r) {
    const std::vector<uint8_t> want(whole.begin() + at * esize, whole.begin() + (at + counts[r]) * esize);
    EXPECT_EQ(first_difference(outs[r], want), "")
        << dtype_name(t) << " " << reduce_op_name(op) << " rank " << r << " of " << n << ", " << counts[r] << " elements";
  }
}

TEST(ShmCollOps, ReducescatterOfEveryDtypeAndOpMatchesTheSerialReference) {
  for (int n : {2, 3, 4}) {
    auto rails = make_mesh(n);
    uint64_t seq = 0;
    for (int t = 0; t < kNumDataTypes; ++t)
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto dtype = static_cast<DataType>(t);
        const size_t piece = 4096 / (static_cast<size_t>(n) * dtype_size(dtype));
        // One step; several steps wrapping the slots; unequal blocks with an empty one.
        std::vector<size_t> small(n, 3), multi(n, piece * 3 + 1), ragged(n);
        for (int r = 0; r < n; ++r) ragged[r] = r == 1 ? 0 : piece * static_cast<size_t>(r + 1) + 11;
        for (const auto* counts : {&small, &multi, &ragged})
          check_reducescatter(rails, dtype, static_cast<ReduceOp>(o), *counts, ++seq);
      }
  }
}

// Runs `body` on every rank and returns each rank's error ("" if it completed).
std::vector<std::string> errors_of(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    try {
      body(r);
    } catch (const NezhaError& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

// matrix[i * n + j] bytes go from rank i to rank j (block i -> j: bytes_of(i * 16 + j, ...)).
void check_alltoall(Mesh& rails, const std::vector<size_t>& matrix, uint64_t seq) {
  const int n = static_cast<int>(rails.size());
  auto at = [n](int i, int j) { return static_cast<size_t>(i) * n + j; };
  std::vector<std::vector<uint8_t>> outs(n);
  run_ranks(n, [&](int r) {
    std::vector<uint8_t> in;
    std::vector<const uint8_t*> send(n);
    std::vector<size_t> send_at(n);
    for (int j = 0; j < n; ++j) {
      send_at[j] = in.size();
      const auto block = bytes_of(r * 16 + j, matrix[at(r, j)], seq);
      in.insert(in.end(), block.begin(), block.end());
    }
    for (int j = 0; j < n; ++j) send[j] = in.data() + send_at[j];
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += matrix[at(i, r)];
    outs[r].assign(total, 0xee);
    std::vector<uint8_t*> recv(n);
    size_t received = 0;
    for (int i = 0; i < n; ++i) {
      recv[i] = outs[r].data() + received;
      received += matrix[at(i, r)];
    }
    rails[r]->start_alltoall(send, recv, matrix, seq)->wait(soon());
  });
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t> want;
    for (int i = 0; i < n; ++i) {
      const auto block = bytes_of(i * 16 + r, matrix[at(i, r)], seq);
      want.insert(want.end(), block.begin(), block.end());
    }
    EXPECT_EQ(first_difference(outs[r], want), "") << "alltoall #" << seq << ", rank " << r;
  }
}

TEST(ShmCollOps, AlltoallOfRaggedMatricesMatchesTheTransposedBlocks) {
  for (int n : {1, 2, 3, 4}) {
    auto rails = make_mesh(n);
    const size_t cells = static_cast<size_t>(n) * n;
    std::vector<size_t> equal(cells, 4096 + 9), ragged(cells), zeros(cells, 0), one_sender(cells, 0);
    for (size_t c = 0; c < cells; ++c) ragged[c] = (c * 7919) % 3 == 0 ? 0 : (c * 2654435761u) % 13000;
    for (int j = 0; j < n; ++j) one_sender[static_cast<size_t>(n - 1) * n + j] = 4096 * 2 + 1;  // streams differ in steps
    uint64_t seq = 0;
    for (const auto* m : {&equal, &ragged, &zeros, &one_sender}) check_alltoall(rails, *m, ++seq);
  }
}

TEST(ShmCollOps, AnAlltoallOfAnotherMatrixFailsOnEveryRankNamingTheRank) {
  auto rails = make_mesh(3);
  auto errors = errors_of(3, [&](int r) {
    std::vector<size_t> m(9, 100);
    if (r == 2) {  // the same total, another layout
      m[0] = 150;
      m[1] = 50;
    }
    std::vector<uint8_t> in(400, 1), out(400);
    std::vector<const uint8_t*> send{in.data(), in.data() + m[r * 3], in.data() + m[r * 3] + m[r * 3 + 1]};
    std::vector<uint8_t*> recv{out.data(), out.data() + m[r], out.data() + m[r] + m[3 + r]};
    rails[r]->start_alltoall(send, recv, m, 4)->wait(soon());
  });
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r << " completed";
  EXPECT_NE(errors[0].find("rank 2 runs alltoall #4 of 900 bytes with other per-rank sizes"), std::string::npos)
      << errors[0];
}

void interleave_the_five_operations(Mesh& rails) {
  const size_t count = 3000;
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    check_broadcast(rails, 4096 * 2 + 3, static_cast<int>(seq % 3), seq * 10);
    check_allgather(rails, {5000, 17, 4096}, seq % 2 == 0, seq * 10 + 1);
    check_reducescatter(rails, DataType::kFloat32, ReduceOp::kSum, {1000, 1, 3000}, seq * 10 + 2);
    check_alltoall(rails, {10, 5000, 0, 7, 0, 4097, 3000, 1, 2}, seq * 10 + 4);
    std::vector<std::vector<uint8_t>> inputs, outs(3);
    for (int r = 0; r < 3; ++r) inputs.push_back(input_of(DataType::kFloat64, r, count));
    const auto want = reference(DataType::kFloat64, inputs, count, ReduceOp::kMax);
    run_ranks(3, [&](int r) {
      outs[r] = inputs[r];
      rails[r]->start_allreduce(outs[r].data(), outs[r].data(), count, DataType::kFloat64, ReduceOp::kMax, seq * 10 + 3)
          ->wait(soon());
    });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(first_difference(outs[r], want), "") << "allreduce, rank " << r;
  }
}

TEST(ShmCollOps, TheFiveOperationsInterleaveOnOneRail) {
  auto rails = make_mesh(3);
  interleave_the_five_operations(rails);
}

// Helper threads change who copies and reduces each part, never the result (shm_coll_crew.h).
TEST(ShmCollOps, TheFiveOperationsWithHelperThreadsGiveTheSameResults) {
  auto rails = make_mesh(3, /*threads=*/3);
  interleave_the_five_operations(rails);
  for (int root = 0; root < 3; ++root) check_broadcast(rails, 4096 * 5 + 1, root, 900 + root);
  check_reducescatter(rails, DataType::kFloat16, ReduceOp::kSum, {4000, 2048, 77}, 950);
}

TEST(ShmCollOps, AMismatchedOperationFailsOnEveryRankNamingTheRank) {
  {  // rank 1 thinks rank 1 is the root
    auto rails = make_mesh(3);
    auto errors = errors_of(3, [&](int r) {
      std::vector<uint8_t> buf(1000, 1);
      rails[r]->start_broadcast(buf.data(), buf.size(), r == 1 ? 1 : 0, 5)->wait(soon());
    });
    for (int r = 0; r < 3; ++r) EXPECT_NE(errors[r].find("rank"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[0].find("rank 1 runs broadcast #5 of 1000 bytes from rank 1"), std::string::npos) << errors[0];
  }
  {  // rank 2 gathers other per-rank sizes with the same total
    auto rails = make_mesh(3);
    auto errors = errors_of(3, [&](int r) {
      const std::vector<size_t> sizes = r == 2 ? std::vector<size_t>{200, 100, 300} : std::vector<size_t>{100, 200, 300};
      std::vector<uint8_t> out(600), in(sizes[r], 3);
      std::vector<uint8_t*> blocks{out.data(), out.data() + sizes[0], out.data() + sizes[0] + sizes[1]};
      rails[r]->start_allgather(in.data(), blocks, sizes, 6)->wait(soon());
    });
    for (int r = 0; r < 3; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r << " completed";
    EXPECT_NE(errors[0].find("rank 2 runs allgather #6 of 600 bytes with other per-rank sizes"), std::string::npos)
        << errors[0];
  }
  {  // rank 0 runs an allreduce where the others reducescatter
    auto rails = make_mesh(2);
    auto errors = errors_of(2, [&](int r) {
      std::vector<float> in(64, 1.0f), out(32);
      if (r == 0) {
        rails[r]->start_allreduce(in.data(), in.data(), 64, DataType::kFloat32, ReduceOp::kSum, 9)->wait(soon());
      } else {
        std::vector<const uint8_t*> blocks{reinterpret_cast<uint8_t*>(in.data()), reinterpret_cast<uint8_t*>(in.data() + 32)};
        rails[r]->start_reducescatter(blocks, out.data(), {32, 32}, DataType::kFloat32, ReduceOp::kSum, 9)->wait(soon());
      }
    });
    EXPECT_NE(errors[0].find("rank 1 runs reducescatter #9 of 64 elements (float32 with Sum)"), std::string::npos)
        << errors[0];
    EXPECT_NE(errors[1].find("rank 0 runs allreduce #9"), std::string::npos) << errors[1];
  }
}

TEST(ShmCollOps, ARankBehindIsNamedAtTheDeadline) {
  auto rails = make_mesh(3);
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> blamed(2, -1);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {  // rank 2, the root, never starts
    std::vector<uint8_t> buf(10000);
    try {
      rails[r]->start_broadcast(buf.data(), buf.size(), 2, 1)->wait(Deadline::after_seconds(0.3));
    } catch (const PeerError& e) {
      blamed[r] = e.peer();
      errors[r] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(blamed[r], 2) << errors[r];
    EXPECT_NE(errors[r].find("rank 2"), std::string::npos) << errors[r];
  }
}

TEST(ShmCollOps, AbortWakesAnAllgatherWaiterAndResetReformsTheRail) {
  auto rails = make_mesh(2);
  std::string what;
  auto waiter = std::thread([&] {
    std::vector<uint8_t> in(100000, 1), out(200000);
    try {  // rank 1 never joins: rank 0 sleeps on its doorbell until the abort
      rails[0]->start_allgather(in.data(), {out.data(), out.data() + 100000}, {100000, 100000}, 1)
          ->wait(Deadline::after_seconds(30));
      what = "no error";
    } catch (const NezhaError& e) {
      what = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  rails[0]->abort("test abort");
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_NE(what.find("test abort"), std::string::npos) << what;
  for (auto& r : rails) r->reset();
  std::vector<std::string> addrs{rails[0]->local_address(), rails[1]->local_address()};
  run_ranks(2, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  check_broadcast(rails, 4096 * 3, 1, 2);
}

TEST(ShmCollOps, TheRailSaysWhatItRunsAndAnAggregationRailRunsOnlyAllreduces) {
  auto rails = make_mesh(1);
  for (auto op : {CollectiveOp::kAllreduce, CollectiveOp::kBroadcast, CollectiveOp::kAllgather,
                  CollectiveOp::kReducescatter, CollectiveOp::kAlltoall})
    EXPECT_TRUE(rails[0]->runs(op)) << collective_op_name(op);
  ShmCollRailConfig no_kernel;
  no_kernel.secret = "s";
  ShmCollRail bare(no_kernel, 0, 1);  // moves bytes, reduces nothing
  EXPECT_TRUE(bare.runs(CollectiveOp::kBroadcast));
  EXPECT_TRUE(bare.runs(CollectiveOp::kAllgather));
  EXPECT_TRUE(bare.runs(CollectiveOp::kAlltoall));
  EXPECT_FALSE(bare.runs(CollectiveOp::kReducescatter));

  AggRailConfig ac;
  ac.name = "agg-test";
  ac.daemon = "127.0.0.1:1";
  ac.secret = "s";
  AggRail agg(ac, 0, 2);
  EXPECT_TRUE(agg.runs(CollectiveOp::kAllreduce));
  for (auto op : {CollectiveOp::kBroadcast, CollectiveOp::kAllgather, CollectiveOp::kReducescatter,
                  CollectiveOp::kAlltoall})
    EXPECT_FALSE(agg.runs(op)) << collective_op_name(op);
  std::vector<uint8_t> buf(8);
  try {
    agg.start_broadcast(buf.data(), buf.size(), 0, 1);
    ADD_FAILURE() << "an aggregation rail started a broadcast";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rail 'agg-test'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not run broadcasts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nezha::transport
