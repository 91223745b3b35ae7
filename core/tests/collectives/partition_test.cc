// Block partitions of the ring: every element in exactly one block, blocks balanced, and (for the
// cache-line partition) every block starting on a 64-byte boundary of the buffer.
#include <cstddef>
#include <algorithm>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/algorithm_util.h"

namespace nezha::collectives::detail {
namespace {

TEST(EvenPartition, SizesDifferByAtMostOneLargerFirst) {
  EXPECT_EQ(even_partition(10, 4), (std::vector<size_t>{3, 3, 2, 2}));
  EXPECT_EQ(even_partition(2, 4), (std::vector<size_t>{1, 1, 0, 0}));
}

TEST(CacheLinePartition, EveryBlockStartsOnACacheLineAndAllElementsAreCovered) {
  for (size_t elem_size : {1, 2, 4, 8}) {
    for (int n : {1, 2, 3, 4, 5, 7}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000003},
                           (size_t{16} << 20) + 5}) {
        const std::vector<size_t> sizes = cache_line_partition(count, n, elem_size);
        ASSERT_EQ(sizes.size(), static_cast<size_t>(n));
        EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), size_t{0}), count);
        const size_t unit = 64 / elem_size;
        size_t offset = 0;
        for (int b = 0; b < n; ++b) {
          EXPECT_EQ(offset * elem_size % 64, 0u) << "block " << b << " of " << count << " x " << elem_size;
          offset += sizes[b];
        }
        // Balanced: apart from the last block's tail (< one unit), sizes differ by at most one unit.
        const size_t largest = *std::max_element(sizes.begin(), sizes.end() - 1 + (n == 1));
        const size_t last_without_tail = sizes.back() - count % unit;
        for (int b = 0; b + 1 < n; ++b) EXPECT_LE(largest - sizes[b], unit);
        EXPECT_LE(largest - std::min(largest, last_without_tail), unit);
      }
    }
  }
}

TEST(CacheLinePartition, ExampleFloat32) {
  // 100 floats = 6 whole 16-float units + 4: units 2,2,1,1 and the tail on the last block.
  EXPECT_EQ(cache_line_partition(100, 4, 4), (std::vector<size_t>{32, 32, 16, 16 + 4}));
}

}  // namespace
}  // namespace nezha::collectives::detail
