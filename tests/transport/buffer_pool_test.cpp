// The recycled buffers behind request bodies and publish pieces.

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "transport/buffer_pool.hpp"

namespace stitch::transport {
namespace {

constexpr size_t MiB = size_t{1} << 20;

TEST(buffer_pool, a_released_buffer_serves_the_next_of_its_class) {
  buffer_pool pool{8 * MiB, 16 * MiB};
  auto a = pool.take(3 * MiB);
  ASSERT_TRUE(a);
  char* first = a.get();
  std::memset(first, 0x5a, 3 * MiB); // the whole class is there to write
  auto b = pool.take(3 * MiB);
  ASSERT_TRUE(b);
  EXPECT_NE(b.get(), first); // still held: another buffer
  EXPECT_EQ(pool.kept(), 0u);
  a.reset();
  EXPECT_EQ(pool.kept(), 3 * MiB);
  // Any size of the same whole-MiB class takes it; another class does not.
  auto other = pool.take(MiB);
  EXPECT_NE(other.get(), first);
  auto c = pool.take(2 * MiB + 1);
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(pool.kept(), 0u);
}

TEST(buffer_pool, keeps_no_more_than_its_limit) {
  buffer_pool pool{8 * MiB, 10 * MiB};
  std::vector<std::shared_ptr<char[]>> held;
  for (int i = 0; i < 4; ++i)
    held.push_back(pool.take(4 * MiB));
  held.clear();
  // Two 4 MiB buffers fit in 10 MiB; the others went to the system.
  EXPECT_EQ(pool.kept(), 8 * MiB);
  auto x = pool.take(4 * MiB);
  auto y = pool.take(4 * MiB);
  EXPECT_EQ(pool.kept(), 0u);
}

TEST(buffer_pool, sizes_over_its_largest_class_are_not_kept) {
  buffer_pool pool{2 * MiB, 64 * MiB};
  auto big = pool.take(3 * MiB);
  ASSERT_TRUE(big);
  std::memset(big.get(), 1, 3 * MiB);
  big.reset();
  EXPECT_EQ(pool.kept(), 0u);
  auto none = pool.take(0);
  EXPECT_TRUE(none); // a valid, empty buffer
  none.reset();
  EXPECT_EQ(pool.kept(), 0u);
}

TEST(buffer_pool, threads_take_and_release_concurrently) {
  buffer_pool pool{4 * MiB, 8 * MiB};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t size = (static_cast<size_t>(t + i) % 4 + 1) * MiB - 3;
        auto b = pool.take(size);
        ASSERT_TRUE(b);
        b[0] = static_cast<char>(t);
        b[size - 1] = static_cast<char>(i);
        EXPECT_EQ(b[0], static_cast<char>(t));
      }
    });
  for (auto& th : threads)
    th.join();
  EXPECT_LE(pool.kept(), 8 * MiB);
}

} // namespace
} // namespace stitch::transport
