#include "gpu/cpu_parallel.hpp"

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/random_bytes.hpp"

#include "gpu/checksum.hpp"
#include "gpu/device.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"

namespace {

using stitch::testing::random_bytes;

} // namespace

TEST(thread_pool, runs_every_index_exactly_once_on_several_threads) {
  stitch::gpu::thread_pool pool{4};
  EXPECT_EQ(pool.size(), 4u);
  std::vector<std::atomic<int>> hits(1000);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  pool.run(hits.size(), [&](size_t i) {
    hits[i].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    std::lock_guard lock{mutex};
    threads.insert(std::this_thread::get_id());
  });
  for (auto& h : hits)
    EXPECT_EQ(h.load(), 1);
  EXPECT_GT(threads.size(), 1u);
}

TEST(thread_pool, many_calls_zero_and_one) {
  stitch::gpu::thread_pool pool{3};
  pool.run(0, [](size_t) { FAIL(); });
  std::atomic<size_t> sum{0};
  for (size_t round = 0; round < 200; ++round)
    pool.run(round % 7, [&](size_t i) { sum += i + 1; });
  size_t expected = 0;
  for (size_t round = 0; round < 200; ++round)
    for (size_t i = 0; i < round % 7; ++i)
      expected += i + 1;
  EXPECT_EQ(sum.load(), expected);
}

TEST(thread_pool, concurrent_callers_and_nested_calls) {
  stitch::gpu::thread_pool pool{3};
  std::atomic<size_t> total{0};
  auto caller = [&] {
    for (int k = 0; k < 50; ++k)
      pool.run(10, [&](size_t) { pool.run(3, [&](size_t) { total += 1; }); });
  };
  std::thread a{caller};
  std::thread b{caller};
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2u * 50 * 10 * 3);
}

TEST(thread_pool, first_exception_reaches_the_caller) {
  stitch::gpu::thread_pool pool{2};
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.run(20,
                        [&](size_t i) {
                          ++ran;
                          if (i == 5)
                            throw std::runtime_error("boom");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 20);
  // The pool still works afterwards.
  ran = 0;
  pool.run(4, [&](size_t) { ++ran; });
  EXPECT_EQ(ran.load(), 4);
}

TEST(parallel_checksum, equals_sequential_above_and_below_the_threshold) {
  stitch::gpu::thread_pool pool{4};
  for (size_t size :
       {size_t{0}, size_t{1000}, stitch::gpu::parallel_threshold - 1,
        stitch::gpu::parallel_threshold + stitch::checksum::chunk_size / 3, size_t{20} << 20}) {
    auto bytes = random_bytes(size, static_cast<uint32_t>(size));
    uint64_t sequential = stitch::checksum::tree_checksum(bytes);
    EXPECT_EQ(stitch::gpu::parallel_tree_checksum(bytes, pool), sequential) << size;
    EXPECT_EQ(stitch::gpu::parallel_tree_checksum(bytes), sequential) << size;
  }
}

TEST(parallel_xor, equals_sequential_and_checks_sizes) {
  stitch::gpu::thread_pool pool{4};
  size_t size = (size_t{17} << 20) + 13;
  auto base = random_bytes(size, 1);
  auto delta = random_bytes(size, 2);
  auto expected = base;
  ASSERT_TRUE(stitch::delta::xor_apply(expected, delta));
  auto parallel = base;
  ASSERT_TRUE(stitch::gpu::parallel_xor_apply(parallel, delta, pool));
  EXPECT_EQ(parallel, expected);
  auto shared = base;
  ASSERT_TRUE(stitch::gpu::parallel_xor_apply(shared, delta));
  EXPECT_EQ(shared, expected);
  std::span<const std::byte> shorter{delta.data(), delta.size() - 1};
  auto failed = stitch::gpu::parallel_xor_apply(parallel, shorter, pool);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, stitch::errc::decode_failure);
}

TEST(device, count_is_zero_without_a_usable_gpu_and_kernel_matches_cpu) {
  int count = stitch::gpu::device_count();
  EXPECT_GE(count, 0);
  if (!stitch::gpu::cuda_compiled()) {
    EXPECT_EQ(count, 0);
  }
  auto base = random_bytes((size_t{3} << 20) + 7, 3);
  auto delta = random_bytes(base.size(), 4);
  auto expected = base;
  ASSERT_TRUE(stitch::delta::xor_apply(expected, delta));
  auto on_device = base;
  auto applied = stitch::gpu::device_xor_apply(on_device, delta);
  if (count == 0) {
    ASSERT_FALSE(applied);
    EXPECT_EQ(applied.error().code, stitch::errc::engine_unavailable);
    GTEST_SKIP() << "no CUDA device (compiled: " << stitch::gpu::cuda_compiled() << ")";
  }
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_EQ(on_device, expected);
  // Unaligned start: the byte kernel path.
  auto unaligned = base;
  ASSERT_TRUE(stitch::gpu::device_xor_apply(std::span<std::byte>{unaligned}.subspan(1),
                                            std::span<const std::byte>{delta}.subspan(1)));
  EXPECT_EQ(unaligned[0], base[0]);
  EXPECT_TRUE(std::equal(unaligned.begin() + 1, unaligned.end(), expected.begin() + 1));
}
