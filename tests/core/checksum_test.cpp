#include "runtime/core/checksum.hpp"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/random_bytes.hpp"
#include <xxhash.h>

namespace cs = stitch::checksum;

namespace {

using stitch::testing::random_bytes;

/// The DESIGN §1 definition written out with xxhash directly.
uint64_t reference_checksum(const std::vector<std::byte>& bytes) {
  std::vector<unsigned char> words;
  for (size_t offset = 0; offset < bytes.size(); offset += size_t{1} << 20) {
    size_t len = std::min(size_t{1} << 20, bytes.size() - offset);
    uint64_t digest = XXH3_64bits(bytes.data() + offset, len);
    for (int i = 0; i < 8; ++i)
      words.push_back(static_cast<unsigned char>(digest >> (8 * i)));
  }
  return XXH3_64bits(words.data(), words.size());
}

/// Runs the indices in reverse, so the result cannot depend on the order.
class reverse_for final : public stitch::parallel_for {
public:
  void run(size_t n, const std::function<void(size_t)>& fn) override {
    calls = n;
    for (size_t i = n; i-- > 0;)
      fn(i);
  }
  size_t calls = 0;
};

} // namespace

TEST(checksum, empty_input_is_xxh3_of_no_digests) {
  EXPECT_EQ(cs::tree_checksum({}), XXH3_64bits(nullptr, 0));
  EXPECT_EQ(cs::tree_checksum({}), 0x2d06800538d394c2ull);
  EXPECT_EQ(cs::combine({}), 0x2d06800538d394c2ull);
  EXPECT_EQ(cs::chunk_count(0), 0u);
  cs::tree_hasher hasher;
  EXPECT_EQ(hasher.digest(), 0x2d06800538d394c2ull);
}

TEST(checksum, known_answer_over_several_chunks) {
  // Three full chunks and a short one.
  auto bytes = random_bytes(3 * cs::chunk_size + 12345, 7);
  uint64_t expected = reference_checksum(bytes);
  EXPECT_EQ(cs::chunk_count(bytes.size()), 4u);
  EXPECT_EQ(cs::tree_checksum(bytes), expected);
  // Not the flat hash: the chunking really is part of the value.
  EXPECT_NE(expected, XXH3_64bits(bytes.data(), bytes.size()));

  std::vector<uint64_t> digests;
  for (size_t offset = 0; offset < bytes.size(); offset += cs::chunk_size)
    digests.push_back(cs::chunk_digest(std::span<const std::byte>{bytes}.subspan(
      offset, std::min(cs::chunk_size, bytes.size() - offset))));
  EXPECT_EQ(cs::combine(digests), expected);
}

TEST(checksum, chunk_boundaries) {
  for (size_t size :
       {size_t{1}, cs::chunk_size - 1, cs::chunk_size, cs::chunk_size + 1, 2 * cs::chunk_size}) {
    auto bytes = random_bytes(size, static_cast<uint32_t>(size));
    EXPECT_EQ(cs::tree_checksum(bytes), reference_checksum(bytes)) << size;
  }
  // One byte is one chunk: xxh3 of the 8-byte LE digest of that byte.
  std::byte one{42};
  uint64_t d = XXH3_64bits(&one, 1);
  unsigned char word[8];
  for (int i = 0; i < 8; ++i)
    word[i] = static_cast<unsigned char>(d >> (8 * i));
  EXPECT_EQ(cs::tree_checksum({&one, 1}), XXH3_64bits(word, 8));
}

TEST(checksum, runner_order_does_not_matter) {
  auto bytes = random_bytes(5 * cs::chunk_size + 3, 9);
  reverse_for runner;
  EXPECT_EQ(cs::tree_checksum(bytes, runner), cs::tree_checksum(bytes));
  EXPECT_EQ(runner.calls, 6u);
  stitch::sequential_for sequential;
  EXPECT_EQ(cs::tree_checksum(bytes, sequential), reference_checksum(bytes));
}

TEST(checksum, incremental_hasher_matches_one_shot_for_random_splits) {
  auto bytes = random_bytes(3 * cs::chunk_size + 777, 11);
  uint64_t expected = cs::tree_checksum(bytes);
  std::mt19937 rng{5};
  for (int round = 0; round < 20; ++round) {
    cs::tree_hasher hasher;
    std::span<const std::byte> rest = bytes;
    // Mix tiny pieces, pieces around the chunk size and big ones.
    size_t max_piece = round % 3 == 0   ? 64
                       : round % 3 == 1 ? cs::chunk_size + 5
                                        : 3 * cs::chunk_size;
    while (!rest.empty()) {
      size_t take = std::min<size_t>(rest.size(), rng() % max_piece + (round % 2));
      hasher.update(rest.first(take));
      rest = rest.subspan(take);
    }
    EXPECT_EQ(hasher.size(), bytes.size());
    EXPECT_EQ(hasher.digest(), expected) << "round " << round;
    // digest() does not end the stream.
    EXPECT_EQ(hasher.digest(), expected);
  }
}

TEST(checksum, hasher_digest_midway_then_continue_and_reset) {
  auto bytes = random_bytes(cs::chunk_size + 100, 13);
  std::span<const std::byte> all = bytes;
  cs::tree_hasher hasher;
  hasher.update(all.first(500));
  EXPECT_EQ(hasher.digest(), cs::tree_checksum(all.first(500)));
  hasher.update(all.subspan(500));
  EXPECT_EQ(hasher.digest(), cs::tree_checksum(all));
  hasher.reset();
  EXPECT_EQ(hasher.size(), 0u);
  hasher.update(all.first(10));
  EXPECT_EQ(hasher.digest(), cs::tree_checksum(all.first(10)));
  cs::tree_hasher moved = std::move(hasher);
  EXPECT_EQ(moved.digest(), cs::tree_checksum(all.first(10)));
}

TEST(checksum, hex_round_trip_and_strict_parsing) {
  EXPECT_EQ(cs::to_hex(0), "0000000000000000");
  EXPECT_EQ(cs::to_hex(0x2d06800538d394c2ull), "2d06800538d394c2");
  EXPECT_EQ(cs::to_hex(~uint64_t{0}), "ffffffffffffffff");
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x0123456789abcdef}, ~uint64_t{0}}) {
    auto parsed = cs::parse_hex(cs::to_hex(v));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parsed, v);
  }
  EXPECT_FALSE(cs::parse_hex(""));
  EXPECT_FALSE(cs::parse_hex("2d06800538d394c"));
  EXPECT_FALSE(cs::parse_hex("2d06800538d394c20"));
  EXPECT_FALSE(cs::parse_hex("2D06800538D394C2"));
  EXPECT_FALSE(cs::parse_hex("0x06800538d394c2"));
  EXPECT_FALSE(cs::parse_hex("2d06800538d394g2"));
  EXPECT_EQ(cs::parse_hex("zz").error().code, stitch::errc::invalid_argument);
}
