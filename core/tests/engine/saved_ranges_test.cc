// SavedRanges against a byte-by-byte model: every byte is copied exactly once, the first time a
// range containing it is saved.
#include "engine/execution/saved_ranges.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace nezha::engine {
namespace {

TEST(SavedRanges, EachByteIsCopiedOnceWhenFirstSaved) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t total = 1 + gen() % 300;
    SavedRanges ranges;
    std::vector<int> copies(total, 0);
    std::vector<bool> model(total, false);
    for (int op = 0; op < 20; ++op) {
      size_t b = gen() % total, e = gen() % (total + 1);
      if (b > e) std::swap(b, e);
      ranges.save(b, e, [&](size_t cb, size_t ce) {
        ASSERT_LT(cb, ce);
        for (size_t i = cb; i < ce; ++i) {
          ASSERT_FALSE(model[i]) << "byte " << i << " copied again";
          ++copies[i];
        }
      });
      for (size_t i = b; i < e; ++i) model[i] = true;
    }
    std::vector<bool> seen(total, false);
    size_t last_end = 0;
    bool first = true;
    ranges.for_each([&](size_t b, size_t e) {
      ASSERT_LT(b, e);
      if (!first) ASSERT_GT(b, last_end) << "ranges overlap or touch: not merged";
      first = false;
      last_end = e;
      for (size_t i = b; i < e; ++i) seen[i] = true;
    });
    ranges.for_each_gap(total, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        ASSERT_FALSE(seen[i]);
        seen[i] = true;
      }
    });
    size_t saved = 0;
    for (size_t i = 0; i < total; ++i) {
      ASSERT_TRUE(seen[i]) << "byte " << i << " neither saved nor a gap";
      EXPECT_EQ(copies[i], model[i] ? 1 : 0) << "byte " << i;
      saved += model[i];
    }
    EXPECT_EQ(ranges.bytes(), saved);
    // The gaps within any window: exactly its bytes not saved, in order (a balanced range's redo).
    for (int w = 0; w < 5; ++w) {
      size_t b = gen() % (total + 1), e = gen() % (total + 1);
      if (b > e) std::swap(b, e);
      std::vector<bool> gap(total, false);
      size_t pos = b;
      ranges.for_each_gap(b, e, [&](size_t gb, size_t ge) {
        ASSERT_LE(pos, gb);
        ASSERT_LT(gb, ge);
        ASSERT_LE(ge, e);
        pos = ge;
        for (size_t i = gb; i < ge; ++i) gap[i] = true;
      });
      for (size_t i = 0; i < total; ++i)
        ASSERT_EQ(gap[i], i >= b && i < e && !model[i]) << "window [" << b << ", " << e << ") byte " << i;
    }
  }
}

TEST(SavedRanges, AdjacentRangesMerge) {
  SavedRanges ranges;
  auto none = [](size_t, size_t) {};
  ranges.save(10, 20, none);
  ranges.save(20, 30, none);
  ranges.save(0, 5, none);
  std::vector<std::pair<size_t, size_t>> got;
  ranges.for_each([&](size_t b, size_t e) { got.push_back({b, e}); });
  EXPECT_EQ(got, (std::vector<std::pair<size_t, size_t>>{{0, 5}, {10, 30}}));
}

}  // namespace
}  // namespace nezha::engine
