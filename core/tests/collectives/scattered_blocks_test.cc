// The scattered-block forms (allgatherv_blocks, alltoallv_blocks, reducescatterv_blocks) and
// reduce_to, on 1..5 in-memory ranks: blocks lie spread out in larger buffers, in an order other
// than rank order, with guard bytes between them that must stay untouched; reducescatterv_blocks
// never writes its input, and its results are bit-identical to the contiguous reducescatterv's.
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "common/error.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::load_value;
using nezha::testing::make_input;
using nezha::testing::reference_reduction;
using nezha::testing::run_ranks;
using nezha::testing::test_options;

constexpr uint8_t kGuard = 0xEE;
constexpr size_t kGap = 16;  // guard bytes before, between and after blocks (keeps blocks aligned)

uint8_t pattern(int src, int dst, size_t i) { return static_cast<uint8_t>(src * 71 + dst * 13 + i * 7 + i / 251); }

// Blocks of the given sizes laid out in reverse rank order with kGap guard bytes around each.
struct Scattered {
  std::vector<uint8_t> buf;
  std::vector<size_t> at;  // offset of block i in buf

  explicit Scattered(const std::vector<size_t>& sizes) : at(sizes.size()) {
    size_t off = kGap;
    for (size_t k = sizes.size(); k-- > 0;) {
      at[k] = off;
      off += sizes[k] + kGap;
    }
    buf.assign(off, kGuard);
  }
  std::vector<uint8_t*> blocks() {
    std::vector<uint8_t*> out(at.size());
    for (size_t i = 0; i < at.size(); ++i) out[i] = buf.data() + at[i];
    return out;
  }
  std::vector<const uint8_t*> const_blocks() {
    const std::vector<uint8_t*> b = blocks();
    return {b.begin(), b.end()};
  }
  // Every byte outside the blocks still holds the guard.
  void expect_guards_intact(const std::vector<size_t>& sizes, const std::string& who) const {
    std::vector<bool> inside(buf.size(), false);
    for (size_t i = 0; i < at.size(); ++i)
      for (size_t j = 0; j < sizes[i]; ++j) inside[at[i] + j] = true;
    for (size_t j = 0; j < buf.size(); ++j)
      if (!inside[j]) ASSERT_EQ(buf[j], kGuard) << who << ": guard byte " << j << " overwritten";
  }
};

// (ranks, base elements, segment bytes)
using Params = std::tuple<int, size_t, size_t>;
class ScatteredBlocksTest : public ::testing::TestWithParam<Params> {};

std::vector<size_t> uneven_sizes(int n, size_t base) {
  std::vector<size_t> sizes(n);
  for (int r = 0; r < n; ++r) sizes[r] = r % 3 == 1 ? 0 : base + static_cast<size_t>(r) * 3;
  return sizes;
}

TEST_P(ScatteredBlocksTest, AllgathervBlocksFillsEveryBlockWhereItLies) {
  const auto [n, base, segment_bytes] = GetParam();
  const std::vector<size_t> sizes = uneven_sizes(n, base);
  std::vector<Scattered> outs(n, Scattered(sizes));
  std::vector<std::vector<uint8_t>> ins(n);
  for (int r = 0; r < n; ++r) {
    ins[r].resize(sizes[r]);
    for (size_t i = 0; i < sizes[r]; ++i) ins[r][i] = pattern(r, 0, i);
  }
  run_ranks(n, [&](transport::PointToPointRail& rail) {
    const int r = rail.rank();
    allgatherv_blocks(rail, ins[r].data(), outs[r].blocks(), sizes, test_options(31, segment_bytes));
  });
  for (int r = 0; r < n; ++r) {
    for (int src = 0; src < n; ++src)
      for (size_t i = 0; i < sizes[src]; ++i)
        ASSERT_EQ(outs[r].buf[outs[r].at[src] + i], pattern(src, 0, i))
            << "rank " << r << " block " << src << " byte " << i;
    outs[r].expect_guards_intact(sizes, "rank " + std::to_string(r));
  }
}

TEST_P(ScatteredBlocksTest, AlltoallvBlocksReadsAndWritesPartsWhereTheyLie) {
  const auto [n, base, segment_bytes] = GetParam();
  // send[r][d]: bytes rank r sends rank d (uneven, some zero).
  auto bytes = [&](int src, int dst) { return (src + 2 * dst) % 4 == 3 ? size_t{0} : base + static_cast<size_t>(src * 5 + dst); };
  std::vector<Scattered> ins, outs;
  std::vector<std::vector<size_t>> send(n), recv(n);
  for (int r = 0; r < n; ++r) {
    for (int d = 0; d < n; ++d) {
      send[r].push_back(bytes(r, d));
      recv[r].push_back(bytes(d, r));
    }
    ins.emplace_back(send[r]);
    outs.emplace_back(recv[r]);
    for (int d = 0; d < n; ++d)
      for (size_t i = 0; i < send[r][d]; ++i) ins[r].buf[ins[r].at[d] + i] = pattern(r, d, i);
  }
  run_ranks(n, [&](transport::PointToPointRail& rail) {
    const int r = rail.rank();
    alltoallv_blocks(rail, ins[r].const_blocks(), send[r], outs[r].blocks(), recv[r],
                     test_options(32, segment_bytes));
  });
  for (int r = 0; r < n; ++r) {
    for (int src = 0; src < n; ++src)
      for (size_t i = 0; i < recv[r][src]; ++i)
        ASSERT_EQ(outs[r].buf[outs[r].at[src] + i], pattern(src, r, i))
            << "rank " << r << " from " << src << " byte " << i;
    outs[r].expect_guards_intact(recv[r], "rank " + std::to_string(r));
  }
}

TEST_P(ScatteredBlocksTest, ReducescattervBlocksLeavesItsInputAndMatchesTheContiguousForm) {
  const auto [n, base, segment_bytes] = GetParam();
  const std::vector<size_t> counts = uneven_sizes(n, base);
  size_t total = 0;
  std::vector<size_t> first(n);
  for (int r = 0; r < n; ++r) first[r] = total, total += counts[r];
  const std::pair<DataType, ReduceOp> cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                                                 {DataType::kFloat16, ReduceOp::kSum},
                                                 {DataType::kInt64, ReduceOp::kProduct},
                                                 {DataType::kBFloat16, ReduceOp::kMin}};
  for (const auto& [dtype, op] : cases) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + reduce_op_name(op));
    const size_t esize = dtype_size(dtype);
    std::vector<size_t> bytes(n);
    for (int r = 0; r < n; ++r) bytes[r] = counts[r] * esize;
    std::vector<Scattered> ins(n, Scattered(bytes)), works(n, Scattered(bytes));
    std::vector<std::vector<uint8_t>> contiguous(n), reference_out(n), outs(n);
    for (int r = 0; r < n; ++r) {
      contiguous[r] = make_input(dtype, r, total);
      for (int b = 0; b < n; ++b)
        if (bytes[b] > 0)
          std::memcpy(ins[r].buf.data() + ins[r].at[b], contiguous[r].data() + first[b] * esize, bytes[b]);
      reference_out[r].assign(bytes[r], 0);
      outs[r].assign(bytes[r] + 2 * kGap, kGuard);  // this rank's block goes to its own buffer
    }
    const std::vector<Scattered> ins_before = ins;
    run_ranks(n, [&](transport::PointToPointRail& rail) {
      const int r = rail.rank();
      std::vector<uint8_t*> work = works[r].blocks();
      work[r] = outs[r].data() + kGap;
      reducescatterv_blocks(rail, ins[r].const_blocks(), work, counts, dtype, op, test_options(33, segment_bytes));
      reducescatterv(rail, contiguous[r].data(), reference_out[r].data(), counts, dtype, op,
                     test_options(34, segment_bytes));
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(ins[r].buf, ins_before[r].buf) << "rank " << r << "'s input was written";
      if (bytes[r] > 0)
        ASSERT_EQ(0, std::memcmp(outs[r].data() + kGap, reference_out[r].data(), bytes[r]))
            << "rank " << r << " differs from the contiguous reducescatterv";
      for (size_t i = 0; i < counts[r]; ++i)
        ASSERT_EQ(load_value(dtype, outs[r].data() + kGap, i), reference_reduction(op, dtype, n, first[r] + i))
            << "rank " << r << " element " << i;
      for (size_t j = 0; j < kGap; ++j) {
        ASSERT_EQ(outs[r][j], kGuard);
        ASSERT_EQ(outs[r][kGap + bytes[r] + j], kGuard);
      }
      std::vector<size_t> written = bytes;
      written[r] = 0;  // went to outs[r]
      works[r].expect_guards_intact(written, "rank " + std::to_string(r) + " work");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksSizesSegments, ScatteredBlocksTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values(0, 1, 700),
                       ::testing::Values(size_t(1) << 20, size_t(64))),
    [](const ::testing::TestParamInfo<Params>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_base" + std::to_string(std::get<1>(info.param)) +
             "_seg" + std::to_string(std::get<2>(info.param));
    });

TEST(ScatteredBlocks, RejectWrongNumberOfBlocksOrNullBlocks) {
  run_ranks(2, [&](transport::PointToPointRail& rail) {
    uint8_t a[8] = {}, b[8] = {};
    EXPECT_THROW(allgatherv_blocks(rail, a, {b}, {4, 4}, test_options()), InvalidArgument);
    EXPECT_THROW(allgatherv_blocks(rail, a, {b, nullptr}, {4, 4}, test_options()), InvalidArgument);
    EXPECT_THROW(alltoallv_blocks(rail, {a, nullptr}, {4, 4}, {b, b + 4}, {4, 4}, test_options()),
                 InvalidArgument);
    EXPECT_THROW(reducescatterv_blocks(rail, {a, a + 4}, {b}, {1, 1}, DataType::kFloat32, ReduceOp::kSum,
                                       test_options()),
                 InvalidArgument);
  });
}

// reduce_to(dst, a, b) equals copying a into dst and reduce_into(dst, b), bit for bit, across its
// internal chunk boundaries, and leaves a and b alone.
TEST(ReduceTo, EqualsCopyThenReduceIntoAndLeavesItsOperands) {
  const size_t count = 50000;  // several 32 KiB chunks, and a partial one
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kInt8, DataType::kInt64, DataType::kBool}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + reduce_op_name(op));
      const std::vector<uint8_t> a = make_input(dtype, 1, count), b = make_input(dtype, 2, count);
      std::vector<uint8_t> expected = a, got(a.size(), 0x5A);
      reduce_into(expected.data(), b.data(), count, dtype, op);
      reduce_to(got.data(), a.data(), b.data(), count, dtype, op);
      ASSERT_EQ(got, expected);
      ASSERT_EQ(a, make_input(dtype, 1, count));
      ASSERT_EQ(b, make_input(dtype, 2, count));
    }
  }
}

}  // namespace
}  // namespace nezha::collectives
