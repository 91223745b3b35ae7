// ShmCollRail with ranks as threads of one process: allreduces of every dtype x op against a serial
// reference written here (rank order, the C++ type's own arithmetic; float16/bfloat16 against the
// kernel applied serially), bits identical on every rank, sizes not divisible by the ranks or the
// chunk, the slot ring wrapping, in place and out of place; the overwrite hook; a rank behind named
// at the deadline; abort waking a waiter; a mismatched allreduce refused; another host refused.
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "collectives/reduce.h"
#include "common/error.h"
#include "common/usable_cores.h"
#include "rank_threads.h"
#include "reduce_reference.h"
#include "transport/rail_factory.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {
namespace {

using testing::first_difference;
using testing::input_of;
using testing::reference;
using testing::run_ranks;

// Small chunks and few slots, so that a few KB take the pipelined path and wrap the slots.
ShmCollRailConfig small_config() {
  ShmCollRailConfig c;
  c.name = "shmcoll-test";
  c.secret = "shmcoll-test-secret";
  c.reduce_into = &collectives::reduce_into;
  c.chunk_bytes = 4096;
  c.slots = 2;
  c.small_bytes = 512;
  c.liveness_slice_ms = 20;
  return c;
}

std::vector<std::unique_ptr<ShmCollRail>> make_mesh(int n, const ShmCollRailConfig& config = small_config()) {
  std::vector<std::unique_ptr<ShmCollRail>> rails;
  for (int r = 0; r < n; ++r) rails.push_back(std::make_unique<ShmCollRail>(config, r, n));
  std::vector<std::string> addrs;
  for (const auto& r : rails) addrs.push_back(r->local_address());
  const Deadline deadline = Deadline::after_seconds(10);
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, deadline); });
  return rails;
}

// Runs one allreduce on every rank and checks each rank's output against the reference, bit for bit.
void check_allreduce(std::vector<std::unique_ptr<ShmCollRail>>& rails, DataType t, ReduceOp op, size_t count,
                     bool in_place, uint64_t seq) {
  const int n = static_cast<int>(rails.size());
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(input_of(t, r, count));
  const std::vector<uint8_t> want = reference(t, inputs, count, op);
  std::vector<std::vector<uint8_t>> outputs(n);
  run_ranks(n, [&](int r) {
    std::vector<uint8_t> buf = inputs[r];
    outputs[r].assign(buf.size(), 0xee);
    void* out = in_place ? buf.data() : outputs[r].data();
    rails[r]->start_allreduce(buf.data(), out, count, t, op, seq)->wait(Deadline::after_seconds(20));
    if (in_place) outputs[r] = buf;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(first_difference(outputs[r], want), "")
        << dtype_name(t) << " " << reduce_op_name(op) << " count " << count << " rank " << r
        << (in_place ? " in place" : " out of place");
}

TEST(ShmCollRail, EveryDtypeAndOpMatchesTheSerialReference) {
  for (int n : {2, 3, 4}) {
    auto rails = make_mesh(n);
    uint64_t seq = 0;
    for (int t = 0; t < kNumDataTypes; ++t)
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto dtype = static_cast<DataType>(t);
        const auto op = static_cast<ReduceOp>(o);
        ASSERT_TRUE(rails[0]->reduces(dtype, op));
        // Whole-chunk (small) path, one pipelined chunk, several chunks wrapping the slots; odd sizes.
        for (size_t count : {size_t{1}, size_t{13}, size_t{4096 / dtype_size(dtype)} - 3, size_t{5003}})
          check_allreduce(rails, dtype, op, count, /*in_place=*/seq % 2 == 0, seq++);
      }
  }
}

// With helper threads (shm_coll_crew.h) every copy and reduction is cut into pieces of a cache
// line or more: the same bits as one thread, on every path (whole chunk, sliced, wrapping slots).
TEST(ShmCollRail, HelperThreadsGiveTheSameBitsAsOne) {
  ShmCollRailConfig c = small_config();
  c.threads = 3;
  c.thread_min_bytes = 64;
  for (int n : {2, 3}) {
    auto rails = make_mesh(n, c);
    uint64_t seq = 0;
    for (int t = 0; t < kNumDataTypes; ++t)
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        const auto dtype = static_cast<DataType>(t);
        for (size_t count : {size_t{13}, size_t{4096 / dtype_size(dtype)} - 3, size_t{5003}})
          check_allreduce(rails, dtype, op, count, /*in_place=*/seq % 2 == 0, seq++);
      }
  }
}

TEST(ShmCollRail, OneRankAndEmptySharesAreTheirOwnResult) {
  auto one = make_mesh(1);
  check_allreduce(one, DataType::kFloat32, ReduceOp::kSum, 3000, true, 1);
  auto rails = make_mesh(3);
  check_allreduce(rails, DataType::kFloat32, ReduceOp::kSum, 0, true, 1);
  check_allreduce(rails, DataType::kFloat32, ReduceOp::kSum, 777, false, 2);  // steps still agree after
}

TEST(ShmCollRail, LargeSharesWithTheDefaultPipeline) {
  ShmCollRailConfig c = small_config();
  c.chunk_bytes = ShmCollRailConfig().chunk_bytes;
  c.slots = ShmCollRailConfig().slots;
  c.small_bytes = ShmCollRailConfig().small_bytes;
  auto rails = make_mesh(4, c);
  check_allreduce(rails, DataType::kFloat32, ReduceOp::kSum, (3 << 20) / 4 + 5, true, 1);
  check_allreduce(rails, DataType::kFloat64, ReduceOp::kMax, 1000, false, 2);
  check_allreduce(rails, DataType::kInt32, ReduceOp::kSum, (1 << 20) + 1, true, 3);
}

TEST(ShmCollRail, TheOverwriteHookCoversTheOutputOnceInChunkOrder) {
  auto rails = make_mesh(2);
  const size_t count = 5000;  // 20000 bytes: five chunks of 4096
  std::vector<std::vector<std::pair<size_t, size_t>>> calls(2);
  run_ranks(2, [&](int r) {
    std::vector<float> buf(count, 1.0f);
    rails[r]->start_allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, 1,
                              [&](size_t off, size_t bytes) { calls[r].push_back({off, bytes}); })
        ->wait(Deadline::after_seconds(10));
  });
  for (int r = 0; r < 2; ++r) {
    size_t next = 0;
    for (auto [off, bytes] : calls[r]) {
      EXPECT_EQ(off, next);
      next = off + bytes;
    }
    EXPECT_EQ(next, count * 4);
    EXPECT_EQ(calls[r].size(), 5u);
  }
}

TEST(ShmCollRail, ARankBehindIsNamedAtTheDeadline) {
  auto rails = make_mesh(3);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(2, [&](int r) {  // rank 2 never starts
    std::vector<float> buf(100, 1.0f);
    try {
      rails[r]->start_allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, 1)
          ->wait(Deadline::after_seconds(0.3));
    } catch (const PeerError& e) {  // a TimeoutError, or the other waiter's report of it
      EXPECT_EQ(e.peer(), 2);
      errors[r] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (const auto& e : errors) EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
}

TEST(ShmCollRail, AbortWakesAWaiterAtOnce) {
  auto rails = make_mesh(2);
  auto waiter = std::async(std::launch::async, [&] {
    std::vector<float> buf(100000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      rails[0]->start_allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, 1)
          ->wait(Deadline::after_seconds(30));
    } catch (const NezhaError& e) {
      return std::make_pair(std::string(e.what()), std::chrono::steady_clock::now() - start);
    }
    return std::make_pair(std::string("no error"), std::chrono::steady_clock::now() - start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past the spin: asleep on the futex
  rails[0]->abort("test abort");
  const auto [what, took] = waiter.get();
  EXPECT_NE(what.find("test abort"), std::string::npos) << what;
  EXPECT_LT(took, std::chrono::seconds(2));
  // The peer, starting later, fails at once too (the aborted rank closed its segment) and names it.
  std::vector<float> buf(100000, 1.0f);
  try {
    rails[1]->start_allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, 1)
        ->wait(Deadline::after_seconds(10));
    ADD_FAILURE() << "the peer of an aborted rank completed";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), 0) << e.what();
  }
  // reset + connect re-forms the rail.
  for (auto& r : rails) r->reset();
  std::vector<std::string> addrs{rails[0]->local_address(), rails[1]->local_address()};
  run_ranks(2, [&](int r) { rails[r]->connect(addrs, Deadline::after_seconds(10)); });
  check_allreduce(rails, DataType::kFloat32, ReduceOp::kSum, 3000, true, 2);
}

TEST(ShmCollRail, AMismatchedAllreduceFailsOnEveryRank) {
  auto rails = make_mesh(3);
  std::vector<std::string> errors(3);
  run_ranks(3, [&](int r) {
    std::vector<float> buf(2000, 1.0f);
    const size_t count = r == 1 ? 1999 : 2000;
    try {
      rails[r]->start_allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, 7)
          ->wait(Deadline::after_seconds(10));
    } catch (const NezhaError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_NE(errors[r].find("rank"), std::string::npos) << "rank " << r << ": " << errors[r];
  EXPECT_NE(errors[0].find("rank 1 runs allreduce #7 of 1999"), std::string::npos) << errors[0];
}

TEST(ShmCollRail, ARankOfAnotherHostIsRefusedByName) {
  ShmCollRailConfig a = small_config(), b = small_config();
  a.host_id = "host-a";
  b.host_id = "host-b";
  ShmCollRail r0(a, 0, 2), r1(b, 1, 2);
  try {
    r0.connect({r0.local_address(), r1.local_address()}, Deadline::after_seconds(2));
    FAIL() << "connected across hosts";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 is not on this host"), std::string::npos) << e.what();
  }
}

TEST(ShmCollRail, TheFactoryBuildsACollectiveRail) {
  RailSpec spec;
  spec.kind = "shmcoll";
  spec.options = {{"chunk_bytes", "8192"}, {"slots", "3"}};
  RailContext ctx;
  ctx.secret = "s";
  auto without_kernel = make_rail(spec, ctx);
  ASSERT_NE(without_kernel->as_collective(), nullptr);
  EXPECT_FALSE(without_kernel->as_collective()->reduces(DataType::kFloat32, ReduceOp::kSum));
  ctx.reduce_into = &collectives::reduce_into;
  auto rail = make_rail(spec, ctx);
  EXPECT_EQ(rail->as_point_to_point(), nullptr);
  EXPECT_EQ(rail->properties().kind, "shmcoll");
  EXPECT_TRUE(rail->as_collective()->reduces(DataType::kBFloat16, ReduceOp::kProduct));
  spec.options = {{"slots", "1"}};
  EXPECT_THROW(make_rail(spec, ctx), InvalidArgument);
  spec.options = {{"ring_bytes", "8192"}};
  EXPECT_THROW(make_rail(spec, ctx), InvalidArgument);
}

// The configuration the factory's maker gives a rail of `spec` in a job of `size` ranks, `local_size`
// of them on this host (0: the job's size counts).
ShmCollRailConfig made_config(const RailSpec& spec, int size, int local_size) {
  RailContext ctx;
  ctx.secret = "s";
  ctx.reduce_into = &collectives::reduce_into;
  ctx.size = size;
  ctx.local_size = local_size;
  auto rail = make_rail(spec, ctx);
  auto* coll = dynamic_cast<ShmCollRail*>(rail.get());
  EXPECT_NE(coll, nullptr);
  return coll ? coll->config() : ShmCollRailConfig();
}

// Where this host's ranks outnumber the cores every wait is a sleep: shares up to 128 KiB take the
// one-wait path and nobody spins. With a core each (or many ranks over many hosts, few here) the
// defaults stay; an explicit option always wins.
TEST(ShmCollRail, WhereRanksOutnumberTheCoresSharesUpTo128KiBTakeOneWaitAndNobodySpins) {
  RailSpec spec;
  spec.kind = "shmcoll";
  auto config_of = [&](int size, int local_size) { return made_config(spec, size, local_size); };
  const ShmCollRailConfig defaults;
  const int cores = usable_cores();
  for (int local : {0, cores}) {  // 0: the job's size counts
    const ShmCollRailConfig c = config_of(cores, local);
    EXPECT_EQ(c.small_bytes, defaults.small_bytes);
    EXPECT_EQ(c.spin_us, defaults.spin_us);
  }
  EXPECT_EQ(config_of(4 * cores, cores).spin_us, defaults.spin_us);  // the others are elsewhere
  for (int local : {0, cores + 1}) {
    const ShmCollRailConfig c = config_of(cores + 1, local);
    EXPECT_EQ(c.small_bytes, size_t{128} << 10);
    EXPECT_EQ(c.spin_us, 0);
  }
  spec.options = {{"small_bytes", "4096"}, {"spin_us", "7"}};
  EXPECT_EQ(config_of(cores + 1, 0).small_bytes, 4096u);
  EXPECT_EQ(config_of(cores + 1, 0).spin_us, 7);
  spec.options = {{"chunk_bytes", "65536"}};  // never above a chunk
  EXPECT_EQ(config_of(cores + 1, 0).small_bytes, 65536u);
}

// Helper threads only where the host's cores outnumber its ranks: the cores left idle shared out,
// at most 4 by default; an explicit count wins, within [1, kMaxShmCollThreads].
TEST(ShmCollRail, HelperThreadsTakeTheCoresTheRanksLeaveIdle) {
  RailSpec spec;
  spec.kind = "shmcoll";
  auto threads_of = [&](int size, int local_size) { return made_config(spec, size, local_size).threads; };
  const int cores = usable_cores();
  EXPECT_EQ(threads_of(cores + 1, 0), 1) << "ranks outnumber the cores";
  EXPECT_EQ(threads_of(cores, cores), 1) << "a core per rank";
  EXPECT_EQ(threads_of(1, 1), std::min(cores, 4));
  EXPECT_EQ(threads_of(64, 1), std::min(cores, 4)) << "the other ranks are on other hosts";
  if (cores >= 4) EXPECT_EQ(threads_of(cores / 2, cores / 2), 2);
  spec.options = {{"threads", "3"}};
  EXPECT_EQ(threads_of(cores + 1, 0), 3);
  for (const char* bad : {"0", "9"}) {
    spec.options = {{"threads", bad}};
    try {
      made_config(spec, 2, 2);
      ADD_FAILURE() << "threads=" << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("threads in [1, 8]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace nezha::transport
