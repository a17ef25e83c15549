#include "runtime/core/delta_codec.hpp"

#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dc = stitch::delta;
using stitch::errc;
using testing::HasSubstr;

namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<std::byte> out(n);
  for (auto& b : out)
    b = static_cast<std::byte>(rng());
  return out;
}

/// A new version of `old` with about one word in a hundred changed.
std::vector<std::byte> sparse_update(const std::vector<std::byte>& old, uint32_t seed) {
  auto out = old;
  std::mt19937 rng{seed};
  for (size_t i = 0; i + 8 <= out.size(); i += 8) {
    if (rng() % 100 == 0)
      out[i + rng() % 8] ^= std::byte{0x5a};
  }
  return out;
}

} // namespace

TEST(delta_xor, encode_then_apply_round_trips_at_odd_sizes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4099}}) {
    auto old_bytes = random_bytes(n, 1);
    auto new_bytes = random_bytes(n, 2);
    std::vector<std::byte> delta(n);
    ASSERT_TRUE(dc::xor_encode(old_bytes, new_bytes, delta));
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(delta[i], old_bytes[i] ^ new_bytes[i]);
    auto base = old_bytes;
    ASSERT_TRUE(dc::xor_apply(base, delta));
    EXPECT_EQ(base, new_bytes) << n;
  }
}

TEST(delta_xor, unaligned_spans_and_aliasing_output) {
  auto old_bytes = random_bytes(1000, 3);
  auto new_bytes = random_bytes(1000, 4);
  std::span<const std::byte> o{old_bytes};
  std::span<const std::byte> nw{new_bytes};
  auto out = old_bytes; // encode in place over a copy of old
  std::span<std::byte> inplace = std::span<std::byte>{out}.subspan(3, 900);
  ASSERT_TRUE(dc::xor_encode(o.subspan(3, 900), nw.subspan(5, 900), inplace));
  for (size_t i = 0; i < 900; ++i)
    ASSERT_EQ(out[3 + i], old_bytes[3 + i] ^ new_bytes[5 + i]);
}

TEST(delta_xor, unchanged_bytes_encode_to_zero) {
  auto old_bytes = random_bytes(4096, 5);
  auto new_bytes = sparse_update(old_bytes, 6);
  std::vector<std::byte> delta(old_bytes.size());
  ASSERT_TRUE(dc::xor_encode(old_bytes, new_bytes, delta));
  for (size_t i = 0; i < delta.size(); ++i)
    EXPECT_EQ(delta[i] == std::byte{0}, old_bytes[i] == new_bytes[i]);
}

TEST(delta_xor, size_mismatch_is_an_error) {
  std::vector<std::byte> a(8), b(9), out(8);
  auto encoded = dc::xor_encode(a, b, out);
  ASSERT_FALSE(encoded);
  EXPECT_EQ(encoded.error().code, errc::invalid_argument);
  EXPECT_FALSE(dc::xor_encode(a, a, b));
  auto applied = dc::xor_apply(a, b);
  ASSERT_FALSE(applied);
  EXPECT_EQ(applied.error().code, errc::decode_failure);
  EXPECT_THAT(applied.error().message, HasSubstr("9 bytes"));
}

TEST(delta_overwrite, replaces_bytes_of_equal_size_only) {
  auto base = random_bytes(100, 7);
  auto replacement = random_bytes(100, 8);
  ASSERT_TRUE(dc::overwrite_apply(base, replacement));
  EXPECT_EQ(base, replacement);
  std::vector<std::byte> shorter(99);
  auto failed = dc::overwrite_apply(base, shorter);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, errc::decode_failure);
  EXPECT_EQ(base, replacement);
}

TEST(delta_zstd, round_trip_of_a_sparse_xor_delta) {
  auto old_bytes = random_bytes(1 << 20, 9);
  auto new_bytes = sparse_update(old_bytes, 10);
  std::vector<std::byte> delta(old_bytes.size());
  ASSERT_TRUE(dc::xor_encode(old_bytes, new_bytes, delta));
  for (int level : {1, 3, -5}) {
    auto packed = dc::compress(delta, level);
    ASSERT_TRUE(packed) << packed.error().message;
    EXPECT_LT(packed->size(), delta.size() / 4) << level;
    auto unpacked = dc::decompress(*packed, delta.size());
    ASSERT_TRUE(unpacked) << unpacked.error().message;
    EXPECT_EQ(*unpacked, delta);
  }
}

TEST(delta_zstd, empty_and_level_checks) {
  auto packed = dc::compress({}, 3);
  ASSERT_TRUE(packed);
  auto unpacked = dc::decompress(*packed, 0);
  ASSERT_TRUE(unpacked);
  EXPECT_TRUE(unpacked->empty());
  std::vector<std::byte> some(10);
  auto bad_level = dc::compress(some, dc::max_level() + 1);
  ASSERT_FALSE(bad_level);
  EXPECT_EQ(bad_level.error().code, errc::invalid_argument);
}

TEST(delta_zstd, oversize_frames_are_refused) {
  auto data = random_bytes(1000, 11);
  auto packed = dc::compress(data, 3);
  ASSERT_TRUE(packed);
  auto too_small = dc::decompress(*packed, 999);
  ASSERT_FALSE(too_small);
  EXPECT_EQ(too_small.error().code, errc::decode_failure);
  EXPECT_THAT(too_small.error().message, HasSubstr("declares 1000 bytes"));
  auto too_large = dc::decompress(*packed, 1001);
  ASSERT_FALSE(too_large);
  EXPECT_THAT(too_large.error().message, HasSubstr("fewer than the expected"));
  // Two frames: the second one overflows the expected size.
  auto twice = *packed;
  twice.insert(twice.end(), packed->begin(), packed->end());
  auto overflow = dc::decompress(twice, 1500);
  ASSERT_FALSE(overflow);
  EXPECT_THAT(overflow.error().message, HasSubstr("more than the expected"));
  auto both = dc::decompress(twice, 2000);
  ASSERT_TRUE(both);
}

TEST(delta_zstd, truncated_and_corrupt_frames_are_decode_failures) {
  auto data = random_bytes(5000, 12);
  auto packed = dc::compress(data, 3);
  ASSERT_TRUE(packed);
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, packed->size() / 2, packed->size() - 1}) {
    std::span<const std::byte> part{packed->data(), cut};
    auto out = dc::decompress(part, data.size());
    ASSERT_FALSE(out) << cut;
    EXPECT_EQ(out.error().code, errc::decode_failure) << cut;
  }
  // Flipping any single byte of the payload or checksum must not pass silently.
  for (size_t pos = 6; pos < packed->size(); pos += packed->size() / 17 + 1) {
    auto corrupt = *packed;
    corrupt[pos] ^= std::byte{0x40};
    auto out = dc::decompress(corrupt, data.size());
    ASSERT_FALSE(out) << "corruption at " << pos << " went unnoticed";
    EXPECT_EQ(out.error().code, errc::decode_failure) << pos;
  }
  std::vector<std::byte> garbage = random_bytes(64, 13);
  auto out = dc::decompress(garbage, 64);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, errc::decode_failure);
}

TEST(delta_zstd, decompress_into_a_caller_buffer) {
  auto data = random_bytes(3000, 14);
  auto packed = dc::compress(data, 1);
  ASSERT_TRUE(packed);
  std::vector<std::byte> out(3000);
  ASSERT_TRUE(dc::decompress_into(*packed, out));
  EXPECT_EQ(out, data);
  std::vector<std::byte> small(2999);
  EXPECT_FALSE(dc::decompress_into(*packed, small));
}
