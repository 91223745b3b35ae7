// striped_layout(): which bytes of the input and output each share of a striped broadcast,
// allgather, reducescatter or alltoall carries, checked against a brute-force account of every
// byte. For random shapes, rank counts and tilings of the plan (a plan's shares, or a balancer's
// many small ranges): every byte of every rank's input is sent by exactly one share and every byte
// of its output written by exactly one, each piece lies inside its own block and carries that
// block's proportion of it, and what a rank sends a peer is exactly what that peer expects.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/execution/striped_parts.h"

namespace nezha::engine {
namespace {

struct Tiling {
  std::vector<size_t> offsets, counts;
  size_t total = 0;
};

// `pieces` ranges (some empty) tiling [0, total) in order.
Tiling random_tiling(std::mt19937_64& rng, size_t pieces) {
  Tiling t;
  for (size_t k = 0; k < pieces; ++k) {
    const size_t c = rng() % 4 == 0 ? 0 : 1 + rng() % 5000;
    t.offsets.push_back(t.total);
    t.counts.push_back(c);
    t.total += c;
  }
  if (t.total == 0) {
    t.counts.back() = 1;
    t.total = 1;
  }
  return t;
}

// Rows of `n` ranks' blocks: some empty, some large.
std::vector<int64_t> random_rows(std::mt19937_64& rng, size_t k) {
  std::vector<int64_t> rows(k);
  for (auto& r : rows) r = rng() % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 700);
  return rows;
}

Response random_response(std::mt19937_64& rng, OpType type, int n) {
  Response r;
  r.type = type;
  r.names = {"t"};
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt8, DataType::kFloat16};
  r.dtype = dtypes[rng() % 4];
  r.row_elements = {1 + static_cast<int64_t>(rng() % 7)};
  switch (type) {
    case OpType::kBroadcast:
      r.counts = {static_cast<int64_t>(rng() % 100000)};
      r.root = static_cast<int32_t>(rng() % n);
      break;
    case OpType::kAllgather:
    case OpType::kReducescatter:
      r.rank_rows = random_rows(rng, n);
      break;
    case OpType::kAlltoall:
      r.splits_matrix = random_rows(rng, static_cast<size_t>(n) * n);
      break;
    default:
      break;
  }
  return r;
}

// Bytes of rank `me`'s input and output, and where each peer's block starts in them (bytes).
struct Blocks {
  std::vector<size_t> in_start, out_start;  // n + 1 entries: block i is [start[i], start[i + 1])
};

Blocks blocks_of(const Response& r, int me, int n) {
  const size_t e = dtype_size(r.dtype), row = static_cast<size_t>(r.row_elements[0]);
  Blocks b;
  b.in_start.assign(n + 1, 0);
  b.out_start.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    size_t in = 0, out = 0;
    switch (r.type) {
      case OpType::kBroadcast:  // one block, in place: input and output are the same buffer
        in = out = i == 0 ? static_cast<size_t>(r.counts[0]) * e : 0;
        break;
      case OpType::kAllgather:
        in = i == 0 ? static_cast<size_t>(r.rank_rows[me]) * row * e : 0;
        out = static_cast<size_t>(r.rank_rows[i]) * row * e;
        break;
      case OpType::kReducescatter:
        in = static_cast<size_t>(r.rank_rows[i]) * row * e;
        out = i == 0 ? static_cast<size_t>(r.rank_rows[me]) * row * e : 0;
        break;
      case OpType::kAlltoall:
        in = static_cast<size_t>(r.splits_matrix[me * n + i]) * row * e;
        out = static_cast<size_t>(r.splits_matrix[i * n + me]) * row * e;
        break;
      default:
        break;
    }
    b.in_start[i + 1] = b.in_start[i] + in;
    b.out_start[i + 1] = b.out_start[i] + out;
  }
  return b;
}

// Marks [at, at + bytes) as carried by `piece`; a byte carried twice, or out of range, fails.
void mark(std::vector<int>& owner, size_t at, size_t bytes, int piece, const std::string& what) {
  ASSERT_LE(at + bytes, owner.size()) << what << ": piece " << piece << " runs past the buffer";
  for (size_t x = at; x < at + bytes; ++x) {
    ASSERT_EQ(owner[x], -1) << what << ": byte " << x << " carried by pieces " << owner[x] << " and " << piece;
    owner[x] = piece;
  }
}

// [at, at + bytes) lies in block `i` of `start` and is the share's proportion of it: the block's
// elements times count / total, rounded down at both ends, so it is off by less than one element.
void expect_proportional(const std::vector<size_t>& start, int i, size_t at, size_t bytes, size_t esize,
                         const Tiling& t, size_t k, const std::string& what) {
  if (bytes == 0) return;
  EXPECT_GE(at, start[i]) << what;
  EXPECT_LE(at + bytes, start[i + 1]) << what;
  const double block = static_cast<double>((start[i + 1] - start[i]) / esize);
  const double exact = block * static_cast<double>(t.counts[k]) / static_cast<double>(t.total);
  EXPECT_LT(std::fabs(static_cast<double>(bytes / esize) - exact), 1.0 + 1e-9) << what;
}

void check(const Response& r, int n, const Tiling& t, const std::string& label) {
  const size_t e = dtype_size(r.dtype);
  const int root = r.type == OpType::kBroadcast ? r.root : -1;
  // layouts[me][k]: rank me's layout of piece k.
  std::vector<std::vector<StripedLayout>> layouts(n);
  for (int me = 0; me < n; ++me)
    for (size_t k = 0; k < t.counts.size(); ++k)
      layouts[me].push_back(striped_layout(r, me, n, root, t.offsets[k], t.counts[k], t.total));

  for (int me = 0; me < n; ++me) {
    const Blocks b = blocks_of(r, me, n);
    std::vector<int> in_owner(b.in_start[n], -1), out_owner(b.out_start[n], -1);
    const bool has_input = r.type != OpType::kBroadcast || me == root;
    for (size_t k = 0; k < t.counts.size(); ++k) {
      const StripedLayout& l = layouts[me][k];
      const int piece = static_cast<int>(k);
      const std::string what = label + " rank " + std::to_string(me) + " piece " + std::to_string(k);
      ASSERT_EQ(l.packs, r.type == OpType::kAlltoall || r.type == OpType::kReducescatter) << what;
      if (l.packs) {
        size_t sum = 0;
        for (int i = 0; i < n; ++i) {
          mark(in_owner, l.send_at[i], l.send_bytes[i], piece, what + " input");
          expect_proportional(b.in_start, i, l.send_at[i], l.send_bytes[i], e, t, k, what + " send to " + std::to_string(i));
          sum += l.send_bytes[i];
        }
        EXPECT_EQ(l.input_bytes, sum) << what;
      } else if (has_input) {
        mark(in_owner, l.input_at, l.input_bytes, piece, what + " input");
        expect_proportional(b.in_start, 0, l.input_at, l.input_bytes, e, t, k, what + " input");
      } else {
        EXPECT_EQ(l.input_bytes, 0u) << what << ": a broadcast's receiver sends nothing";
      }
      if (r.type == OpType::kAllgather || r.type == OpType::kAlltoall) {
        for (int i = 0; i < n; ++i) {
          mark(out_owner, l.recv_at[i], l.recv_bytes[i], piece, what + " output");
          expect_proportional(b.out_start, i, l.recv_at[i], l.recv_bytes[i], e, t, k, what + " from " + std::to_string(i));
        }
      } else {
        mark(out_owner, l.output_at, l.output_bytes, piece, what + " output");
        expect_proportional(b.out_start, 0, l.output_at, l.output_bytes, e, t, k, what + " output");
      }
      // What this rank sends peer i in this piece is what peer i's layout expects from it.
      for (int i = 0; i < n; ++i) {
        const StripedLayout& peer = layouts[i][k];
        switch (r.type) {
          case OpType::kBroadcast:
            EXPECT_EQ(l.output_at, peer.output_at) << what;
            EXPECT_EQ(l.output_bytes, peer.output_bytes) << what;
            break;
          case OpType::kAllgather:
            EXPECT_EQ(l.input_bytes, peer.recv_bytes[me]) << what << " to " << i;
            break;
          case OpType::kAlltoall:
            EXPECT_EQ(l.send_bytes[i], peer.recv_bytes[me]) << what << " to " << i;
            break;
          case OpType::kReducescatter:  // every rank sends i the same part of i's block: i's own
            EXPECT_EQ(l.send_bytes[i], peer.output_bytes) << what << " to " << i;
            EXPECT_EQ(l.send_at[i] - b.in_start[i], peer.output_at) << what << " to " << i;
            break;
          default:
            break;
        }
      }
    }
    for (size_t x = 0; x < in_owner.size(); ++x)
      if (has_input) ASSERT_NE(in_owner[x], -1) << label << " rank " << me << ": input byte " << x << " sent by no piece";
    for (size_t x = 0; x < out_owner.size(); ++x)
      ASSERT_NE(out_owner[x], -1) << label << " rank " << me << ": output byte " << x << " written by no piece";
  }
}

TEST(StripedLayout, EveryByteIsCarriedOnceByTheShareItsBlockProportionGivesIt) {
  std::mt19937_64 rng(11);
  const OpType types[] = {OpType::kBroadcast, OpType::kAllgather, OpType::kReducescatter, OpType::kAlltoall};
  for (int trial = 0; trial < 400; ++trial) {
    const OpType type = types[trial % 4];
    const int n = 1 + static_cast<int>(rng() % 6);
    const Response r = random_response(rng, type, n);
    // A plan's few shares, or a balancer's many ranges.
    const Tiling t = random_tiling(rng, trial % 2 ? 1 + rng() % 4 : 5 + rng() % 30);
    check(r, n, t, std::string(op_type_name(type)) + " trial " + std::to_string(trial));
    if (HasFatalFailure()) return;
  }
}

TEST(StripedLayout, AnOperationThatIsNotStripedIsRefused) {
  Response r;
  r.type = OpType::kAllreduce;
  EXPECT_THROW(striped_layout(r, 0, 2, -1, 0, 1, 2), NezhaError);
}

}  // namespace
}  // namespace nezha::engine
