// Device buffers, the staging pipeline and the device checksum, run the same
// way on the host device (the CPU fallback, always) and on CUDA device 0
// (skipped, saying why, where there is none), and compared with the CPU
// implementations of the same operations on the same inputs.
#include "gpu/device_memory.hpp"

#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/random_bytes.hpp"

#include "gpu/device.hpp"
#include "gpu/nccl_group.hpp"
#include "gpu/stager.hpp"
#include "gpu/xxh3_blocks.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"

namespace {

using stitch::gpu::device_buffer;
using stitch::gpu::device_stager;
using stitch::gpu::device_stream;

using stitch::testing::random_bytes;

/// The block decomposition of the xxh3 long path, run on the CPU exactly as
/// the kernel runs it: each full block's lane sums from its four 16-byte
/// columns, then each lane's chain over them, its tail, and the merge.
uint64_t decomposed_xxh3(std::span<const std::byte> bytes) {
  namespace x = stitch::gpu::xxh3;
  const auto* in = reinterpret_cast<const unsigned char*>(bytes.data());
  const unsigned char* secret = stitch::gpu::xxh3_default_secret.b;
  const size_t len = bytes.size();
  uint64_t keys[x::stripes_per_block * x::lanes];
  for (size_t t = 0; t < std::size(keys); ++t)
    keys[t] = x::stripe_key(secret, (t / x::lanes) * 8, t % x::lanes);
  std::vector<uint64_t> sums(x::full_blocks(len) * x::lanes, 0);
  for (size_t b = 0; b < x::full_blocks(len); ++b)
    for (size_t k = 0; k < x::lanes / 2; ++k)
      x::pair_block_sums(in + b * x::block_len, keys, k, false, sums[b * x::lanes + 2 * k],
                         sums[b * x::lanes + 2 * k + 1]);
  uint64_t acc[x::lanes];
  for (size_t i = 0; i < x::lanes; ++i) {
    acc[i] = x::initial_acc(i);
    for (size_t b = 0; b < x::full_blocks(len); ++b)
      acc[i] = x::chain_step(acc[i], sums[b * x::lanes + i], x::scramble_key(secret, i));
    acc[i] = x::lane_tail(acc[i], in, len, secret, i);
  }
  return x::merge(acc, secret, len);
}

const std::vector<size_t>& checksum_sizes() {
  static const std::vector<size_t> sizes = {0,
                                            1,
                                            240,
                                            241,
                                            1000,
                                            1024,
                                            1025,
                                            4096 + 64,
                                            (size_t{1} << 20) - 1,
                                            size_t{1} << 20,
                                            (size_t{1} << 20) + 1,
                                            (size_t{1} << 20) + 241,
                                            (size_t{3} << 20) + 240,
                                            (size_t{5} << 20) + 8};
  return sizes;
}

/// The device under test, or a skip that says why there is none.
#define REQUIRE_DEVICE(device)                                                                     \
  do {                                                                                             \
    if ((device) != stitch::gpu::host_device)                                                      \
      if (auto why = stitch::gpu::why_no_device(); !why.empty())                                   \
        GTEST_SKIP() << "needs a CUDA device: " << why;                                            \
  } while (false)

class on_device : public ::testing::TestWithParam<int> {};

std::string device_label(const ::testing::TestParamInfo<int>& info) {
  return info.param == stitch::gpu::host_device ? "host" : "cuda" + std::to_string(info.param);
}

device_buffer upload(int device, std::span<const std::byte> bytes, device_stream& stream) {
  auto buf = device_buffer::allocate(device, bytes.size());
  EXPECT_TRUE(buf) << buf.error().message;
  EXPECT_TRUE(stitch::gpu::copy_to_device(*buf, 0, bytes, stream));
  return std::move(*buf);
}

std::vector<std::byte> download(const device_buffer& buf, device_stream& stream) {
  std::vector<std::byte> out(buf.size());
  EXPECT_TRUE(stitch::gpu::copy_to_host(out, buf, 0, stream));
  EXPECT_TRUE(stream.synchronize());
  return out;
}

} // namespace

TEST(xxh3_blocks, the_decomposition_equals_xxh3_for_every_long_length) {
  for (size_t len : {size_t{241}, size_t{255}, size_t{256}, size_t{1023}, size_t{1024},
                     size_t{1025}, size_t{1088}, size_t{2047}, size_t{2048}, size_t{65536 + 63},
                     (size_t{1} << 20) - 1, size_t{1} << 20}) {
    auto bytes = random_bytes(len, static_cast<uint32_t>(len));
    EXPECT_EQ(decomposed_xxh3(bytes), stitch::checksum::chunk_digest(bytes)) << len;
  }
  // Every byte matters, in every position of a stripe and of the tail.
  auto bytes = random_bytes(size_t{1} << 20, 7);
  for (size_t at : {size_t{0}, size_t{63}, size_t{1024 * 1022 + 5}, (size_t{1} << 20) - 1}) {
    auto flipped = bytes;
    flipped[at] ^= std::byte{0x10};
    EXPECT_EQ(decomposed_xxh3(flipped), stitch::checksum::chunk_digest(flipped)) << at;
    EXPECT_NE(decomposed_xxh3(flipped), decomposed_xxh3(bytes)) << at;
  }
}

TEST_P(on_device, checksum_equals_the_cpu_checksum_single_bit_changes_included) {
  const int device = GetParam();
  REQUIRE_DEVICE(device);
  auto stream = device_stream::create(device);
  ASSERT_TRUE(stream) << stream.error().message;
  for (size_t n : checksum_sizes()) {
    auto bytes = random_bytes(n, static_cast<uint32_t>(n + 1));
    auto buf = upload(device, bytes, *stream);
    auto sum = stitch::gpu::device_tree_checksum(buf, 0, n, *stream);
    ASSERT_TRUE(sum) << sum.error().message;
    EXPECT_EQ(*sum, stitch::checksum::tree_checksum(bytes)) << n << " bytes";
    if (n == 0)
      continue;
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      auto flipped = bytes;
      flipped[at] ^= std::byte{0x01};
      auto fbuf = upload(device, flipped, *stream);
      auto fsum = stitch::gpu::device_tree_checksum(fbuf, 0, n, *stream);
      ASSERT_TRUE(fsum) << fsum.error().message;
      EXPECT_EQ(*fsum, stitch::checksum::tree_checksum(flipped)) << n << " bytes, bit at " << at;
      EXPECT_NE(*fsum, *sum) << n << " bytes, bit at " << at;
    }
  }
  // A range inside a buffer, at a chunk boundary.
  auto bytes = random_bytes((size_t{2} << 20) + 300, 9);
  auto buf = upload(device, bytes, *stream);
  auto part =
    stitch::gpu::device_tree_checksum(buf, size_t{1} << 20, (size_t{1} << 20) + 300, *stream);
  ASSERT_TRUE(part) << part.error().message;
  EXPECT_EQ(*part, stitch::checksum::tree_checksum(std::span{bytes}.subspan(size_t{1} << 20)));
}

TEST_P(on_device, staged_deltas_equal_the_cpu_decoders_output) {
  const int device = GetParam();
  REQUIRE_DEVICE(device);
  // Small chunks, so the ring wraps many times within one tensor (the host
  // stand-in runs the ring too).
  auto stager =
    device_stager::create(device, {.chunk_bytes = 64 << 10, .ring = 3, .ring_on_host = true});
  ASSERT_TRUE(stager) << stager.error().message;
  const size_t n = (size_t{2} << 20) + 12345;
  auto base = random_bytes(n, 1);
  auto xor_delta = random_bytes(n, 2);
  auto replacement = random_bytes(5000, 3);
  // The CPU reference: xor, then an overwrite of one range.
  auto expected = base;
  ASSERT_TRUE(stitch::delta::xor_apply(expected, xor_delta));
  std::memcpy(expected.data() + 777, replacement.data(), replacement.size());

  auto base_buf = device_buffer::allocate(device, n);
  auto shadow = device_buffer::allocate(device, n);
  ASSERT_TRUE(base_buf && shadow);
  ASSERT_TRUE((*stager)->write(*base_buf, 0, base, true));
  ASSERT_TRUE((*stager)->copy(*shadow, *base_buf));
  // Delta pieces arrive in a reused scratch, as a decoder hands them over.
  std::vector<std::byte> scratch(100000);
  for (size_t done = 0; done < n; done += scratch.size()) {
    size_t k = std::min(scratch.size(), n - done);
    std::memcpy(scratch.data(), xor_delta.data() + done, k);
    ASSERT_TRUE((*stager)->xor_apply(*shadow, done, std::span{scratch}.first(k)));
    std::memset(scratch.data(), 0xAB, k); // the stager must not read it later
  }
  std::memcpy(scratch.data(), replacement.data(), replacement.size());
  ASSERT_TRUE((*stager)->write(*shadow, 777, std::span{scratch}.first(replacement.size())));
  std::memset(scratch.data(), 0, replacement.size());
  ASSERT_TRUE((*stager)->finish());
  auto stream = device_stream::create(device);
  ASSERT_TRUE(stream);
  EXPECT_EQ(download(*shadow, *stream), expected);
  EXPECT_EQ(download(*base_buf, *stream), base) << "the base is left as it was";
  auto sum = (*stager)->checksum(*shadow, n);
  ASSERT_TRUE(sum) << sum.error().message;
  EXPECT_EQ(*sum, stitch::checksum::tree_checksum(expected));
  auto c = (*stager)->stats();
  EXPECT_EQ(c.bytes_xored, n);
  EXPECT_EQ(c.bytes_copied, n + n + replacement.size());
  EXPECT_EQ(c.bytes_verified, n);
}

TEST_P(on_device, patch_workers_fill_the_ring_side_by_side) {
  const int device = GetParam();
  REQUIRE_DEVICE(device);
  // More workers than slots, chunks small enough that each piece spans
  // several, pieces large enough that the copy is split over the pool.
  auto stager = device_stager::create(
    device, {.chunk_bytes = (size_t{3} << 20) + 8, .ring = 2, .ring_on_host = true});
  ASSERT_TRUE(stager) << stager.error().message;
  constexpr size_t workers = 5;
  const size_t n = (size_t{7} << 20) + 24;
  std::vector<std::vector<std::byte>> bases, deltas, expected;
  std::vector<device_buffer> bufs;
  for (size_t w = 0; w < workers; ++w) {
    bases.push_back(random_bytes(n, static_cast<uint32_t>(10 + w)));
    deltas.push_back(random_bytes(n, static_cast<uint32_t>(20 + w)));
    expected.push_back(bases.back());
    ASSERT_TRUE(stitch::delta::xor_apply(expected.back(), deltas.back()));
    auto buf = device_buffer::allocate(device, n);
    ASSERT_TRUE(buf) << buf.error().message;
    bufs.push_back(std::move(*buf));
  }
  std::vector<stitch::status> outcomes(workers);
  {
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w)
      threads.emplace_back([&, w] {
        // Each worker's pieces come out of one scratch it overwrites after
        // every call, as a decoder's do.
        std::vector<std::byte> scratch(n / 2 + 8);
        for (auto [from, xor_into] : {std::pair{&bases[w], false}, std::pair{&deltas[w], true}})
          for (size_t done = 0; done < n && outcomes[w]; done += scratch.size()) {
            const size_t k = std::min(scratch.size(), n - done);
            std::memcpy(scratch.data(), from->data() + done, k);
            auto piece = std::span{scratch}.first(k);
            outcomes[w] = xor_into ? (*stager)->xor_apply(bufs[w], done, piece)
                                   : (*stager)->write(bufs[w], done, piece);
            std::memset(scratch.data(), 0xCD, k);
          }
      });
    for (auto& t : threads)
      t.join();
  }
  for (size_t w = 0; w < workers; ++w)
    ASSERT_TRUE(outcomes[w]) << outcomes[w].error().message;
  ASSERT_TRUE((*stager)->finish());
  auto stream = device_stream::create(device);
  ASSERT_TRUE(stream);
  for (size_t w = 0; w < workers; ++w)
    EXPECT_TRUE(download(bufs[w], *stream) == expected[w]) << "worker " << w;
  auto c = (*stager)->stats();
  EXPECT_EQ(c.bytes_copied, workers * n);
  EXPECT_EQ(c.bytes_xored, workers * n);
}

TEST_P(on_device, out_of_range_operations_are_refused_and_the_error_is_kept_until_finish) {
  const int device = GetParam();
  REQUIRE_DEVICE(device);
  auto stager = device_stager::create(device);
  ASSERT_TRUE(stager);
  auto buf = device_buffer::allocate(device, 100);
  ASSERT_TRUE(buf);
  std::vector<std::byte> bytes(64);
  auto wrote = (*stager)->write(*buf, 50, bytes);
  ASSERT_FALSE(wrote);
  EXPECT_EQ(wrote.error().code, stitch::errc::invalid_argument);
  EXPECT_NE(wrote.error().message.find("do not fit"), std::string::npos) << wrote.error().message;
  // Later work is skipped; finish reports the first error and clears it.
  EXPECT_FALSE((*stager)->write(*buf, 0, bytes));
  EXPECT_FALSE((*stager)->finish());
  EXPECT_TRUE((*stager)->write(*buf, 0, bytes));
  EXPECT_TRUE((*stager)->finish());
  auto other = device_buffer::allocate(device, 99);
  ASSERT_TRUE(other);
  EXPECT_FALSE((*stager)->copy(*other, *buf));
  EXPECT_FALSE((*stager)->finish());
}

INSTANTIATE_TEST_SUITE_P(devices, on_device, ::testing::Values(stitch::gpu::host_device, 0),
                         device_label);

TEST(device_memory, without_a_device_cuda_objects_are_refused_with_the_reason) {
  if (stitch::gpu::why_no_device().empty())
    GTEST_SKIP() << "a CUDA device is present: the refusal cannot be seen here";
  auto buf = device_buffer::allocate(0, 1024);
  ASSERT_FALSE(buf);
  EXPECT_EQ(buf.error().code, stitch::errc::engine_unavailable);
  auto stager = device_stager::create(0);
  ASSERT_FALSE(stager);
  EXPECT_FALSE(stager.error().message.empty());
  auto ok = stitch::gpu::require_device(0);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().message, stitch::gpu::why_no_device());
}

TEST(device_memory, host_memory_info_reads_the_machine) {
  auto info = stitch::gpu::memory_info(stitch::gpu::host_device);
  ASSERT_TRUE(info) << info.error().message;
  EXPECT_GT(info->total, 0u);
  EXPECT_LE(info->free, info->total);
  EXPECT_EQ(stitch::gpu::device_name(stitch::gpu::host_device), "host");
}

TEST(pinned_registrar, small_buffers_stay_pageable_and_refusals_are_counted) {
  stitch::gpu::pinned_registrar reg;
  std::vector<std::byte> small(4096);
  EXPECT_TRUE(reg.on_allocate(small));
  EXPECT_EQ(reg.registered() + reg.refused(), 0u);
  std::vector<std::byte> large(size_t{2} << 20);
  EXPECT_TRUE(reg.on_allocate(large)) << "a refusal never fails the allocation";
  EXPECT_EQ(reg.registered() + reg.refused(), 1u);
  if (stitch::gpu::why_no_device().empty())
    EXPECT_EQ(reg.registered(), 1u);
  else
    EXPECT_EQ(reg.refused(), 1u);
  reg.on_release(large);
  reg.on_release(small); // unknown to it: ignored
}

namespace {

/// Counts what an allocator registers and releases; refuses on request.
struct counting_registrar final : stitch::gpu::buffer_registrar {
  std::atomic<int> allocated{0};
  std::atomic<int> released{0};
  bool refuse = false;
  stitch::status on_allocate(std::span<std::byte>) override {
    if (refuse)
      return stitch::make_error(stitch::errc::limit_exceeded, "refused by the test");
    ++allocated;
    return {};
  }
  void on_release(std::span<std::byte>) noexcept override { ++released; }
};

constexpr size_t mib = size_t{1} << 20;

} // namespace

TEST(host_allocator, without_a_recycling_limit_released_buffers_are_freed) {
  stitch::gpu::host_allocator alloc;
  auto reg = std::make_shared<counting_registrar>();
  alloc.add_registrar(reg);
  for (int i = 0; i < 2; ++i) {
    auto b = alloc.allocate(6 * mib);
    ASSERT_TRUE(b) << b.error().message;
  }
  EXPECT_EQ(reg->allocated, 2);
  EXPECT_EQ(reg->released, 2);
  EXPECT_EQ(alloc.recycling().kept, 0u);
  EXPECT_EQ(alloc.recycling().reused, 0u);
}

TEST(host_allocator, a_released_buffer_is_kept_registered_and_serves_the_next_of_its_size) {
  stitch::gpu::host_allocator alloc;
  auto reg = std::make_shared<counting_registrar>();
  alloc.add_registrar(reg);
  std::optional<stitch::gpu::recycling_reservation> reserve{std::in_place, alloc, 20 * mib};
  std::byte* first = nullptr;
  {
    auto b = alloc.allocate(6 * mib);
    ASSERT_TRUE(b);
    first = b->data();
    std::memset(b->data(), 0x5A, b->size());
  }
  EXPECT_EQ(reg->released, 0) << "kept, registration and all";
  auto stats = alloc.recycling();
  EXPECT_EQ(stats.kept, 1u);
  EXPECT_EQ(stats.kept_bytes, 6 * mib);
  {
    auto other = alloc.allocate(8 * mib); // another size: a fresh mapping
    ASSERT_TRUE(other);
    EXPECT_NE(other->data(), first);
    auto same = alloc.allocate(6 * mib);
    ASSERT_TRUE(same);
    EXPECT_EQ(same->data(), first);
    EXPECT_EQ(same->bytes()[123], std::byte{0x5A}) << "the same pages, not copied";
  }
  EXPECT_EQ(reg->allocated, 2) << "the reused buffer is not registered again";
  stats = alloc.recycling();
  EXPECT_EQ(stats.reused, 1u);
  EXPECT_EQ(stats.reused_bytes, 6 * mib);
  EXPECT_EQ(stats.kept, 2u);
  // Small buffers come from the heap and are never kept.
  {
    auto small = alloc.allocate(mib);
    ASSERT_TRUE(small);
  }
  EXPECT_EQ(alloc.recycling().kept, 2u);
  // The reservation's end frees what was kept.
  reserve.reset();
  EXPECT_EQ(alloc.recycling().kept, 0u);
  EXPECT_EQ(alloc.recycling().limit, 0u);
  EXPECT_EQ(reg->released, reg->allocated.load());
}

TEST(host_allocator, the_oldest_kept_buffers_make_room_and_the_limit_is_never_passed) {
  stitch::gpu::host_allocator alloc;
  auto reg = std::make_shared<counting_registrar>();
  alloc.add_registrar(reg);
  stitch::gpu::recycling_reservation reserve{alloc, 16 * mib};
  std::vector<std::byte*> order;
  {
    std::vector<stitch::gpu::host_buffer> held;
    for (int i = 0; i < 3; ++i) {
      auto b = alloc.allocate(6 * mib);
      ASSERT_TRUE(b);
      order.push_back(b->data());
      held.push_back(std::move(*b));
    }
    {
      auto too_big = alloc.allocate(18 * mib); // over the limit on its own: freed
      ASSERT_TRUE(too_big);
    }
    EXPECT_EQ(reg->released, 1);
  } // released in order: the third evicts the first
  auto stats = alloc.recycling();
  EXPECT_EQ(stats.kept, 2u);
  EXPECT_EQ(stats.kept_bytes, 12 * mib);
  EXPECT_LE(stats.kept_bytes, stats.limit);
  EXPECT_EQ(reg->released, 2);
  auto again = alloc.allocate(6 * mib);
  ASSERT_TRUE(again);
  EXPECT_NE(again->data(), order[0]) << "the oldest was freed";
}

TEST(host_allocator, kept_buffers_unknown_to_a_new_registrar_and_refused_ones_are_not_reused) {
  stitch::gpu::host_allocator alloc;
  auto first = std::make_shared<counting_registrar>();
  alloc.add_registrar(first);
  stitch::gpu::recycling_reservation reserve{alloc, 64 * mib};
  {
    auto b = alloc.allocate(6 * mib);
    ASSERT_TRUE(b);
  }
  auto second = std::make_shared<counting_registrar>();
  alloc.add_registrar(second);
  {
    auto b = alloc.allocate(6 * mib);
    ASSERT_TRUE(b);
    EXPECT_EQ(second->allocated, 1) << "registered by the registrar added since";
  }
  EXPECT_EQ(alloc.recycling().reused, 0u);
  EXPECT_EQ(first->released, 1) << "the stale kept buffer was freed";
  EXPECT_EQ(alloc.recycling().kept, 1u);
  // A buffer a registrar refused fails its allocation and is never kept.
  second->refuse = true;
  auto refused = alloc.allocate(10 * mib);
  ASSERT_FALSE(refused);
  EXPECT_EQ(alloc.recycling().kept, 1u);
}

TEST(nccl_group, a_one_gpu_group_broadcasts_into_another_buffer_of_that_gpu) {
  if (auto why = stitch::gpu::why_no_device(); !why.empty()) {
    auto refused = stitch::gpu::nccl_group::create({0});
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, stitch::errc::engine_unavailable);
    GTEST_SKIP() << "needs a CUDA device: " << why;
  }
  auto group = stitch::gpu::nccl_group::create({0});
  ASSERT_TRUE(group) << group.error().message;
  auto stream = device_stream::create(0);
  ASSERT_TRUE(stream);
  auto bytes = random_bytes((size_t{3} << 20) + 5, 21);
  auto src = upload(0, bytes, *stream);
  auto dst = device_buffer::allocate(0, bytes.size());
  ASSERT_TRUE(dst);
  const device_buffer* targets[] = {&*dst};
  ASSERT_TRUE((*group)->broadcast(0, src, targets));
  EXPECT_EQ(download(*dst, *stream), bytes);
  auto small = device_buffer::allocate(0, 10);
  ASSERT_TRUE(small);
  const device_buffer* wrong[] = {&*small};
  EXPECT_FALSE((*group)->broadcast(0, src, wrong));
  EXPECT_FALSE(stitch::gpu::nccl_group::create({0, 0})) << "GPUs must be distinct";
}
