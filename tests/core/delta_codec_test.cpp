#include "runtime/core/delta_codec.hpp"

#include <algorithm>
#include <memory>
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

namespace {

/// Compresses `data` in pieces of `piece` bytes through a stream compressor.
std::vector<std::byte> stream_compress(const std::vector<std::byte>& data, size_t piece,
                                       int workers = 0) {
  auto c = dc::stream_compressor::start(data.size(), 1, workers);
  EXPECT_TRUE(c);
  std::vector<std::byte> out;
  for (size_t at = 0; at < data.size(); at += piece)
    EXPECT_TRUE(c->update(std::span{data}.subspan(at, std::min(piece, data.size() - at)), out));
  EXPECT_TRUE(c->finish(out));
  return out;
}

/// An input of `bytes`, handed out `piece` bytes at a time.
dc::compressed_input from(const std::vector<std::byte>& bytes, size_t piece) {
  auto at = std::make_shared<size_t>(0);
  return [&bytes, piece, at](std::span<std::byte> into) -> stitch::result<size_t> {
    size_t n = std::min({into.size(), piece, bytes.size() - *at});
    std::copy_n(bytes.begin() + static_cast<ptrdiff_t>(*at), n, into.begin());
    *at += n;
    return n;
  };
}

} // namespace

TEST(delta_zstd_stream, pieces_of_any_size_round_trip_with_the_one_shot_codec) {
  auto data = random_bytes(100'000, 21);
  for (size_t k = 0; k < data.size(); k += 7)
    data[k] = std::byte{0}; // some structure to compress
  for (size_t piece : {size_t{1}, size_t{777}, size_t{100'000}}) {
    for (int workers : {0, 1}) {
      auto frame = stream_compress(data, piece, workers);
      auto whole = dc::decompress(frame, data.size());
      ASSERT_TRUE(whole) << piece;
      EXPECT_EQ(*whole, data) << "one-shot decode of a streamed frame, piece " << piece;
      auto d = dc::stream_decompressor::start(data.size(), from(frame, piece), 333);
      ASSERT_TRUE(d);
      std::vector<std::byte> out(data.size());
      for (size_t at = 0; at < out.size(); at += 4096)
        ASSERT_TRUE(d->read(std::span{out}.subspan(at, std::min<size_t>(4096, out.size() - at))));
      EXPECT_TRUE(d->finish());
      EXPECT_EQ(out, data) << piece;
    }
  }
  // And a one-shot frame decodes piecewise.
  auto packed = dc::compress(data, 3);
  ASSERT_TRUE(packed);
  auto d = dc::stream_decompressor::start(data.size(), from(*packed, 100));
  ASSERT_TRUE(d);
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(d->read(out));
  EXPECT_TRUE(d->finish());
  EXPECT_EQ(out, data);
}

namespace {

/// What XOR deltas look like: sparse changes (zero runs of every length
/// around them, runs of exactly 3 and 4 bytes, a block that ends inside a
/// run), dense changes (no zero run long enough: zstd's own finder), all
/// zeros, and a mix within one stream.
std::vector<std::vector<std::byte>> xor_shaped_inputs() {
  std::vector<std::vector<std::byte>> inputs;
  std::mt19937_64 rng{31};
  std::vector<std::byte> sparse(1'000'003, std::byte{0});
  for (size_t k = 0; k < sparse.size() / 100; ++k)
    sparse[rng() % sparse.size()] = static_cast<std::byte>(rng() | 1);
  inputs.push_back(sparse);
  std::vector<std::byte> runs;
  for (size_t len = 0; runs.size() < 300'000; len = (len + 1) % 40) {
    runs.insert(runs.end(), len, std::byte{0});
    runs.push_back(std::byte{0x11});
  }
  inputs.push_back(runs);
  std::vector<std::byte> dense(400'000);
  for (size_t k = 0; k < dense.size(); ++k)
    dense[k] = k % 2 ? static_cast<std::byte>(rng() | 1) : std::byte{0};
  inputs.push_back(dense);
  inputs.emplace_back(262'144 + 5, std::byte{0});
  std::vector<std::byte> mixed = dense;
  mixed.insert(mixed.end(), sparse.begin(), sparse.end());
  mixed.insert(mixed.end(), {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{7}});
  inputs.push_back(mixed);
  return inputs;
}

} // namespace

TEST(delta_zstd_stream, xor_shaped_bytes_round_trip_through_every_compressor) {
  for (const auto& data : xor_shaped_inputs()) {
    auto one_shot = dc::compress(data, 1);
    ASSERT_TRUE(one_shot);
    EXPECT_EQ(*dc::decompress(*one_shot, data.size()), data) << data.size();
    for (size_t piece : {size_t{4093}, size_t{1} << 20}) {
      auto frame = stream_compress(data, piece, 0);
      EXPECT_EQ(*dc::decompress(frame, data.size()), data) << data.size() << " " << piece;
    }
  }
}

TEST(delta_zstd_stream, the_xor_match_finder_packs_sparse_deltas_no_worse_than_zstds_own) {
  // zstd with worker threads runs its own match finder only.
  const auto sparse = xor_shaped_inputs().front();
  const auto ours = stream_compress(sparse, 1 << 20, 0);
  const auto zstds = stream_compress(sparse, 1 << 20, 1);
  EXPECT_EQ(*dc::decompress(zstds, sparse.size()), sparse);
  EXPECT_LE(ours.size(), zstds.size());
  EXPECT_LT(ours.size(), sparse.size() / 20) << "1% of the bytes changed";
}

TEST(delta_zstd_stream, a_context_restarts_for_the_next_frame) {
  auto a = random_bytes(5000, 22);
  auto b = random_bytes(7000, 23);
  auto c = dc::stream_compressor::start(a.size(), 1, 1);
  ASSERT_TRUE(c);
  std::vector<std::byte> fa;
  ASSERT_TRUE(c->update(a, fa));
  ASSERT_TRUE(c->finish(fa));
  ASSERT_TRUE(c->restart(b.size()));
  std::vector<std::byte> fb;
  ASSERT_TRUE(c->update(b, fb));
  ASSERT_TRUE(c->finish(fb));
  EXPECT_EQ(*dc::decompress(fa, a.size()), a);
  EXPECT_EQ(*dc::decompress(fb, b.size()), b);
  std::vector<std::byte> extra;
  ASSERT_TRUE(c->restart(10));
  EXPECT_FALSE(c->update(random_bytes(11, 1), extra)) << "more than pledged";
  ASSERT_TRUE(c->restart(10));
  ASSERT_TRUE(c->update(random_bytes(9, 1), extra));
  EXPECT_FALSE(c->finish(extra)) << "fewer than pledged";
}

TEST(delta_zstd_stream, truncated_corrupt_short_and_trailing_input_are_decode_failures) {
  auto data = random_bytes(20'000, 24);
  auto frame = stream_compress(data, 999);
  auto decode = [&](const std::vector<std::byte>& in, uint64_t expected) -> stitch::status {
    auto d = dc::stream_decompressor::start(expected, from(in, 128));
    if (!d)
      return d.error();
    std::vector<std::byte> out(expected);
    if (auto ok = d->read(out); !ok)
      return ok;
    return d->finish();
  };
  ASSERT_TRUE(decode(frame, data.size()));
  auto cut = frame;
  cut.resize(frame.size() / 2);
  auto t = decode(cut, data.size());
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, errc::decode_failure);
  auto flipped = frame;
  flipped[frame.size() / 2] ^= std::byte{0x10};
  EXPECT_FALSE(decode(flipped, data.size()));
  auto more = decode(frame, data.size() + 1);
  ASSERT_FALSE(more) << "a frame holding fewer bytes than expected";
  EXPECT_EQ(more.error().code, errc::decode_failure);
  EXPECT_FALSE(decode(frame, data.size() - 1)) << "a frame holding more bytes than expected";
  auto trailing = frame;
  trailing.push_back(std::byte{0});
  auto tr = decode(trailing, data.size());
  ASSERT_FALSE(tr);
  EXPECT_THAT(tr.error().message, HasSubstr("follow"));
}
