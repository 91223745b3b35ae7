// Where n is not a power of two, the log-step and halving/doubling fold n - p ranks into partners;
// rail rank 0 (the coordinator, whose share times plan every operation) must be one of those folded
// ranks: it hands over its input and receives the result, so its share lasts the whole operation
// (detail::fold_members, algorithm_util.h). Checked by what rank 0 sends and receives, and that every
// rank still gets the exact sum.
#include <algorithm>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "rank_harness.h"

namespace nezha::collectives {
namespace {

using nezha::testing::run_ranks;
using nezha::testing::test_options;

// Forwards to a rail and tallies the payload bytes this rank sent and received.
class Tally final : public transport::PointToPointRail {
 public:
  explicit Tally(transport::PointToPointRail& rail) : rail_(rail) {}
  size_t sent = 0, received = 0, calls = 0;

  const transport::RailProperties& properties() const override { return rail_.properties(); }
  int rank() const override { return rail_.rank(); }
  int size() const override { return rail_.size(); }
  std::string local_address() const override { return rail_.local_address(); }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  transport::RailCounters counters() const override { return rail_.counters(); }
  void abort(const std::string& reason) override { rail_.abort(reason); }
  bool reaches(int peer) const override { return rail_.reaches(peer); }
  size_t send_buffer_bytes() const override { return rail_.send_buffer_bytes(); }
  void send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) override {
    rail_.send(peer, tag, data, bytes, deadline);
    sent += bytes;
    ++calls;
  }
  void recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) override {
    rail_.recv(peer, tag, data, bytes, deadline);
    received += bytes;
    ++calls;
  }
  void sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag, int recv_peer,
                     void* recv_data, size_t recv_bytes, uint64_t recv_tag, const Deadline& deadline) override {
    rail_.sendrecv_tags(send_peer, send_data, send_bytes, send_tag, recv_peer, recv_data, recv_bytes, recv_tag,
                        deadline);
    sent += send_bytes;
    received += recv_bytes;
    ++calls;
  }

 private:
  transport::PointToPointRail& rail_;
};

struct Traffic {
  size_t sent, received;
};

// Every rank's traffic in one allreduce of `count` floats (rank r contributes r + 1 + i % 7).
std::vector<Traffic> run(int n, size_t count, bool halving) {
  std::vector<Traffic> traffic(static_cast<size_t>(n));
  std::mutex mu;
  run_ranks(n, [&](transport::PointToPointRail& rail) {
    Tally tally(rail);
    const int r = rail.rank();
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(r + 1 + i % 7);
    CollectiveOptions opt = test_options();
    if (halving) {
      std::vector<float> out(count);
      allreduce_halving(tally, buf.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
      buf = out;
    } else {
      allreduce_logstep(tally, buf.data(), count, DataType::kFloat32, ReduceOp::kSum, opt);
    }
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(buf[i], static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7))) << "rank " << r;
    std::lock_guard<std::mutex> lock(mu);
    traffic[static_cast<size_t>(r)] = {tally.sent, tally.received};
  });
  return traffic;
}

TEST(FoldNumbering, RankZeroHandsOverItsInputAndReceivesTheResultWhereTheJobIsNotAPowerOfTwo) {
  const size_t count = 4096;  // 16 KB: one segment, one message each way for a folded rank
  const size_t bytes = count * sizeof(float);
  for (bool halving : {false, true}) {
    for (int n : {3, 5, 6, 7, 12}) {
      SCOPED_TRACE((halving ? "halving, n = " : "log-step, n = ") + std::to_string(n));
      const std::vector<Traffic> t = run(n, count, halving);
      EXPECT_EQ(t[0].sent, bytes);
      EXPECT_EQ(t[0].received, bytes);
      // The ranks that run the algorithm move more than that.
      const size_t most = std::max_element(t.begin(), t.end(), [](const Traffic& a, const Traffic& b) {
                            return a.sent < b.sent;
                          })->sent;
      EXPECT_GT(most, bytes);
    }
  }
}

TEST(FoldNumbering, APowerOfTwoKeepsTheRailsNumbering) {
  // No fold: rank 0 runs every exchange (log-step: log2(n) whole buffers).
  const size_t count = 4096, bytes = count * sizeof(float);
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    int rounds = 0;
    while ((1 << rounds) < n) ++rounds;
    const std::vector<Traffic> t = run(n, count, false);
    EXPECT_EQ(t[0].sent, bytes * static_cast<size_t>(rounds));
  }
}

}  // namespace
}  // namespace nezha::collectives
