// allgatherv, broadcast and alltoallv on 1..5 in-memory ranks: every byte checked against the
// block it must have come from. Payload bytes encode (source rank, destination, position).
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "common/error.h"
#include "rank_harness.h"

namespace nezha::collectives {
namespace {

using nezha::testing::run_ranks;
using nezha::testing::run_ranks_collect;
using nezha::testing::test_options;

uint8_t pattern(int src, int dst, size_t i) {
  return static_cast<uint8_t>(src * 71 + dst * 13 + i * 7 + i / 251);
}

// (ranks, base bytes, segment bytes)
using Params = std::tuple<int, size_t, size_t>;

std::string param_name(const ::testing::TestParamInfo<Params>& info) {
  return "n" + std::to_string(std::get<0>(info.param)) + "_bytes" +
         std::to_string(std::get<1>(info.param)) + "_seg" + std::to_string(std::get<2>(info.param));
}

const auto kParams = ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                        ::testing::Values(0, 1, 7, 1000),
                                        ::testing::Values(size_t(1) << 20, size_t(64)));

class DataMovementTest : public ::testing::TestWithParam<Params> {};

// Block sizes that differ per rank and include zeros: base, base+r, and 0 on every third rank.
std::vector<std::vector<size_t>> block_size_patterns(int n, size_t base) {
  std::vector<size_t> same(n, base), growing(n), holes(n);
  for (int r = 0; r < n; ++r) {
    growing[r] = base == 0 ? 0 : base + static_cast<size_t>(r);
    holes[r] = r % 3 == 1 ? 0 : base * static_cast<size_t>(r + 1);
  }
  return {same, growing, holes};
}

TEST_P(DataMovementTest, AllgathervConcatenatesEveryRanksBlock) {
  const auto [n, base, segment_bytes] = GetParam();
  for (const auto& sizes : block_size_patterns(n, base)) {
    for (bool in_place : {false, true}) {
      size_t total = 0;
      std::vector<size_t> offset(n);
      for (int r = 0; r < n; ++r) offset[r] = total, total += sizes[r];
      std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(total, 0xEE));
      std::vector<std::vector<uint8_t>> ins(n);
      for (int r = 0; r < n; ++r) {
        ins[r].resize(sizes[r]);
        for (size_t i = 0; i < sizes[r]; ++i) ins[r][i] = pattern(r, 0, i);
        if (in_place) std::copy(ins[r].begin(), ins[r].end(), outs[r].begin() + offset[r]);
      }
      run_ranks(n, [&](transport::PointToPointRail& rail) {
        const int r = rail.rank();
        const void* in = in_place ? outs[r].data() + offset[r] : ins[r].data();
        allgatherv(rail, in, outs[r].data(), sizes, test_options(11, segment_bytes));
      });
      for (int dst = 0; dst < n; ++dst) {
        for (int src = 0; src < n; ++src) {
          for (size_t i = 0; i < sizes[src]; ++i) {
            ASSERT_EQ(outs[dst][offset[src] + i], pattern(src, 0, i))
                << "rank " << dst << " block of rank " << src << " byte " << i
                << (in_place ? " (in place)" : "");
          }
        }
      }
    }
  }
}

TEST_P(DataMovementTest, BroadcastFromEveryRoot) {
  const auto [n, bytes, segment_bytes] = GetParam();
  for (int root = 0; root < n; ++root) {
    std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(bytes, 0xEE));
    for (size_t i = 0; i < bytes; ++i) bufs[root][i] = pattern(root, 0, i);
    run_ranks(n, [&](transport::PointToPointRail& rail) {
      broadcast(rail, bufs[rail.rank()].data(), bytes, root, test_options(12, segment_bytes));
    });
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(bufs[r][i], pattern(root, 0, i)) << "root " << root << " rank " << r << " byte " << i;
      }
    }
  }
}

TEST_P(DataMovementTest, AlltoallvDeliversEachBlockToItsRank) {
  const auto [n, base, segment_bytes] = GetParam();
  // bytes(src -> dst): varies per pair and is zero for some pairs.
  auto bytes = [&](int src, int dst) -> size_t {
    if (base == 0 || (src + 2 * dst) % 4 == 3) return 0;
    return base + static_cast<size_t>((src * 3 + dst) % 5);
  };
  std::vector<std::vector<uint8_t>> ins(n), outs(n);
  std::vector<std::vector<size_t>> send(n, std::vector<size_t>(n)), recv(n, std::vector<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      send[r][p] = bytes(r, p);
      recv[r][p] = bytes(p, r);
      for (size_t i = 0; i < send[r][p]; ++i) ins[r].push_back(pattern(r, p, i));
    }
    size_t total_in = 0;
    for (int p = 0; p < n; ++p) total_in += recv[r][p];
    outs[r].assign(total_in, 0xEE);
  }
  run_ranks(n, [&](transport::PointToPointRail& rail) {
    const int r = rail.rank();
    alltoallv(rail, ins[r].data(), send[r], outs[r].data(), recv[r], test_options(13, segment_bytes));
  });
  for (int dst = 0; dst < n; ++dst) {
    size_t at = 0;
    for (int src = 0; src < n; ++src) {
      for (size_t i = 0; i < recv[dst][src]; ++i) {
        ASSERT_EQ(outs[dst][at + i], pattern(src, dst, i)) << "rank " << dst << " from " << src;
      }
      at += recv[dst][src];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksBytesSegments, DataMovementTest, kParams, param_name);

// Either side of the size where broadcast turns from a tree into a chain, with pieces that divide
// the payload unevenly, up to 9 ranks (a chain of 8 links, a tree of depth 4), several roots.
TEST(DataMovement, BroadcastTreeAndChainDeliverEveryByte) {
  for (int n : {2, 3, 5, 9}) {
    const size_t chain = kBroadcastChainMinBytes;
    for (size_t bytes : {chain - 1, chain, chain * 3 + 13}) {
      for (size_t segment : {size_t(1) << 20, size_t(40000)}) {
        for (int root = 0; root < n; root += (n > 3 ? 3 : 1)) {
          std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(bytes, 0xEE));
          for (size_t i = 0; i < bytes; ++i) bufs[root][i] = pattern(root, 0, i);
          run_ranks(n, [&](transport::PointToPointRail& rail) {
            broadcast(rail, bufs[rail.rank()].data(), bytes, root, test_options(12, segment));
          });
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(bufs[r], bufs[root]) << n << " ranks, " << bytes << " bytes, segment "
                                           << segment << ", root " << root << ", rank " << r;
        }
      }
    }
  }
}

TEST(DataMovement, InvalidArgumentsAreRejectedBeforeAnyTraffic) {
  const auto errors = run_ranks_collect(2, [&](transport::PointToPointRail& rail) {
    std::vector<uint8_t> buf(8);
    const CollectiveOptions opt = nezha::testing::test_options();
    EXPECT_THROW(broadcast(rail, buf.data(), buf.size(), 2, opt), InvalidArgument);
    EXPECT_THROW(broadcast(rail, buf.data(), buf.size(), -1, opt), InvalidArgument);
    EXPECT_THROW(allgatherv(rail, buf.data(), buf.data(), {4}, opt), InvalidArgument);
    EXPECT_THROW(alltoallv(rail, buf.data(), {4, 4}, buf.data(), {4}, opt), InvalidArgument);
    // Self block sizes disagree.
    EXPECT_THROW(alltoallv(rail, buf.data(), {4, 4}, buf.data(), {2, 2}, opt), InvalidArgument);
  });
  for (const auto& e : errors) EXPECT_FALSE(e);
}

}  // namespace
}  // namespace nezha::collectives
