// BufferPool: scratch buffers are reused (smallest that fits), and the cache stays bounded.
#include "engine/execution/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace nezha::engine {
namespace {

TEST(BufferPoolTest, ReleasedBufferIsReused) {
  BufferPool pool;
  uint8_t* first;
  {
    BufferPool::Buffer b = pool.acquire(4096);
    first = b.data();
    ASSERT_NE(first, nullptr);
    std::memset(b.data(), 0xab, 4096);  // the whole requested size is writable
  }
  BufferPool::Buffer again = pool.acquire(4096);
  EXPECT_EQ(again.data(), first);
}

TEST(BufferPoolTest, SmallerRequestReusesLargerBuffer) {
  BufferPool pool;
  uint8_t* big;
  {
    BufferPool::Buffer b = pool.acquire(1 << 16);
    big = b.data();
  }
  BufferPool::Buffer small = pool.acquire(100);
  EXPECT_EQ(small.data(), big);
}

TEST(BufferPoolTest, LargerRequestGetsFreshBuffer) {
  BufferPool pool;
  uint8_t* small_ptr;
  {
    BufferPool::Buffer small = pool.acquire(128);
    small_ptr = small.data();
  }
  BufferPool::Buffer big = pool.acquire(1 << 20);  // the cached 128-byte buffer does not fit
  EXPECT_NE(big.data(), small_ptr);
  std::memset(big.data(), 1, 1 << 20);
  // The small one is still cached and handed out next.
  BufferPool::Buffer small_again = pool.acquire(64);
  EXPECT_EQ(small_again.data(), small_ptr);
}

TEST(BufferPoolTest, PicksSmallestFittingBuffer) {
  BufferPool pool;
  uint8_t *p1k, *p8k, *p64k;
  {
    BufferPool::Buffer a = pool.acquire(1 << 10), b = pool.acquire(8 << 10), c = pool.acquire(64 << 10);
    p1k = a.data();
    p8k = b.data();
    p64k = c.data();
  }
  BufferPool::Buffer x = pool.acquire(4 << 10);
  EXPECT_EQ(x.data(), p8k);
  BufferPool::Buffer y = pool.acquire(4 << 10);
  EXPECT_EQ(y.data(), p64k);
  BufferPool::Buffer z = pool.acquire(512);
  EXPECT_EQ(z.data(), p1k);
}

TEST(BufferPoolTest, BuffersInUseAreDistinct) {
  BufferPool pool;
  std::vector<BufferPool::Buffer> held;
  std::set<uint8_t*> seen;
  for (int i = 0; i < 8; ++i) {
    held.push_back(pool.acquire(256));
    EXPECT_TRUE(seen.insert(held.back().data()).second);
  }
}

TEST(BufferPoolTest, CacheKeepsAtMostMaxCachedLargestBuffers) {
  BufferPool pool(2);
  uint8_t *p1, *p2, *p3;
  {
    BufferPool::Buffer a = pool.acquire(1000), b = pool.acquire(2000), c = pool.acquire(3000);
    p1 = a.data();
    p2 = b.data();
    p3 = c.data();
  }  // released c, b, a: the smallest (a) is dropped
  BufferPool::Buffer x = pool.acquire(500), y = pool.acquire(500);
  std::set<uint8_t*> got{x.data(), y.data()};
  EXPECT_EQ(got, (std::set<uint8_t*>{p2, p3}));
  (void)p1;
}

TEST(BufferPoolTest, MovedBufferIsReturnedOnce) {
  BufferPool pool(4);
  uint8_t* p;
  {
    BufferPool::Buffer a = pool.acquire(1024);
    p = a.data();
    BufferPool::Buffer b = std::move(a);
    EXPECT_EQ(b.data(), p);
  }
  BufferPool::Buffer x = pool.acquire(1024);
  BufferPool::Buffer y = pool.acquire(1024);
  EXPECT_EQ(x.data(), p);
  EXPECT_NE(y.data(), p);  // not handed out twice
}

}  // namespace
}  // namespace nezha::engine
