// Failures become errors, never hangs: a rank that never joins makes the others time out, a rank
// running another operation (different seq) is caught as a ProtocolError.
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "common/error.h"
#include "rank_harness.h"

namespace nezha::collectives {
namespace {

using nezha::testing::run_ranks_collect;

template <typename E>
bool threw(const std::exception_ptr& e, std::string* what = nullptr) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E& err) {
    if (what) *what = err.what();
    return true;
  } catch (...) {
    return false;
  }
}

// Runs `op` on ranks 0..n-2 while rank n-1 never calls it; every caller must fail with
// TimeoutError close to the deadline.
void expect_timeout_when_last_rank_is_absent(
    int n, const std::function<void(transport::PointToPointRail&, const CollectiveOptions&)>& op) {
  const auto start = Clock::now();
  const auto errors = run_ranks_collect(n, [&](transport::PointToPointRail& rail) {
    if (rail.rank() == n - 1) return;
    CollectiveOptions opt;
    opt.seq = 1;
    opt.deadline = Deadline::after_seconds(0.2);
    op(rail, opt);
  });
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < n - 1; ++r) {
    std::string what;
    EXPECT_TRUE(threw<TimeoutError>(errors[r], &what)) << "rank " << r;
    EXPECT_NE(what.find("rail mem0"), std::string::npos) << what;
  }
  EXPECT_LT(elapsed, 5.0) << "ranks waited far past their deadline";
}

TEST(Failure, AbsentRankTimesOutRingAllreduce) {
  expect_timeout_when_last_rank_is_absent(3, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
    std::vector<float> buf(1000, 1.0f);
    allreduce_ring(rail, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o);
  });
}

TEST(Failure, AbsentRankTimesOutLogstepAllreduce) {
  expect_timeout_when_last_rank_is_absent(4, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
    std::vector<float> buf(10, 1.0f);
    allreduce_logstep(rail, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o);
  });
}

TEST(Failure, AbsentRankTimesOutHalvingAllreduce) {
  for (int n : {4, 6}) {  // 6: the absent rank is an extra one, folded in
    expect_timeout_when_last_rank_is_absent(n, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
      std::vector<float> buf(1000, 1.0f);
      allreduce_halving(rail, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o);
    });
  }
}

TEST(Failure, AbsentRankTimesOutBroadcastAllgatherAlltoall) {
  expect_timeout_when_last_rank_is_absent(3, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
    std::vector<uint8_t> buf(30, 1);
    // Root 2 is the absent rank, so every caller waits on data that never comes.
    broadcast(rail, buf.data(), 10, 2, o);
  });
  expect_timeout_when_last_rank_is_absent(3, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
    std::vector<uint8_t> in(10, 1), out(30);
    allgatherv(rail, in.data(), out.data(), {10, 10, 10}, o);
  });
  expect_timeout_when_last_rank_is_absent(3, [](transport::PointToPointRail& rail, const CollectiveOptions& o) {
    std::vector<uint8_t> in(30, 1), out(30);
    alltoallv(rail, in.data(), {10, 10, 10}, out.data(), {10, 10, 10}, o);
  });
}

TEST(Failure, RankRunningAnotherOperationIsAProtocolError) {
  const int n = 3;
  const auto errors = run_ranks_collect(n, [&](transport::PointToPointRail& rail) {
    CollectiveOptions opt;
    opt.seq = rail.rank() == 1 ? 5 : 4;  // rank 1 is one operation ahead
    opt.deadline = Deadline::after_seconds(2);
    std::vector<float> buf(100, 1.0f);
    allreduce_ring(rail, buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, opt);
  });
  int protocol_errors = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(threw<NezhaError>(errors[r])) << "rank " << r << " finished a desynchronised op";
    protocol_errors += threw<ProtocolError>(errors[r]);
  }
  EXPECT_GE(protocol_errors, 1);
}

}  // namespace
}  // namespace nezha::collectives
