#include "runtime/core/delta_codec.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
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
    for (auto f : {dc::finder::xor_delta, dc::finder::plain, dc::finder::literals}) {
      auto one_shot = dc::compress(data, 1, f);
      ASSERT_TRUE(one_shot);
      EXPECT_EQ(*dc::decompress(*one_shot, data.size()), data)
        << data.size() << " finder " << static_cast<int>(f);
    }
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

TEST(delta_zstd_stream, the_literals_finder_codes_bytes_without_matches) {
  // A random 100-byte pattern repeated: all matches, no skew in the bytes.
  auto pattern = random_bytes(100, 8);
  std::vector<std::byte> repeated;
  while (repeated.size() < (1 << 20))
    repeated.insert(repeated.end(), pattern.begin(), pattern.end());
  auto plain = dc::compress(repeated, 1, dc::finder::plain);
  auto literals = dc::compress(repeated, 1, dc::finder::literals);
  ASSERT_TRUE(plain && literals);
  EXPECT_LT(plain->size(), repeated.size() / 50);
  EXPECT_GT(literals->size(), repeated.size() / 2);
  EXPECT_EQ(*dc::decompress(*literals, repeated.size()), repeated);
  // Skewed bytes still shrink: they are Huffman-coded.
  std::vector<std::byte> skewed = random_bytes(1 << 20, 9);
  for (auto& b : skewed)
    b &= std::byte{0x07};
  auto coded = dc::compress(skewed, 1, dc::finder::literals);
  ASSERT_TRUE(coded);
  EXPECT_LT(coded->size(), skewed.size() / 2);
  EXPECT_EQ(*dc::decompress(*coded, skewed.size()), skewed);
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

namespace {

/// The run list of `xored` encoded in pieces of `piece` bytes, concatenated.
std::vector<std::byte> runs_of(const std::vector<std::byte>& xored, size_t piece) {
  std::vector<std::byte> out;
  std::vector<std::byte> room(dc::sparse_encode_bound(piece));
  for (size_t at = 0; at < xored.size(); at += piece) {
    auto chunk = std::span{xored}.subspan(at, std::min(piece, xored.size() - at));
    size_t n = dc::sparse_encode(chunk, room);
    out.insert(out.end(), room.begin(), room.begin() + static_cast<ptrdiff_t>(n));
  }
  return out;
}

/// Input that hands out `bytes` at most `step` at a time.
dc::compressed_input feed(std::vector<std::byte> bytes, size_t step) {
  auto held = std::make_shared<std::pair<std::vector<std::byte>, size_t>>(std::move(bytes), 0);
  return [held, step](std::span<std::byte> into) -> stitch::result<size_t> {
    auto& [b, at] = *held;
    size_t n = std::min({into.size(), step, b.size() - at});
    std::copy_n(b.begin() + static_cast<ptrdiff_t>(at), n, into.begin());
    at += n;
    return n;
  };
}

/// Applies `runs` to `base` in pieces of `piece` bytes; the first error.
stitch::status apply_runs(std::vector<std::byte>& base, std::vector<std::byte> runs, size_t piece,
                          size_t feed_step, size_t buffer,
                          std::vector<std::byte>* dense = nullptr) {
  dc::sparse_applier a{base.size(), feed(std::move(runs), feed_step), buffer};
  std::vector<std::byte> scratch(piece);
  for (size_t at = 0; at < base.size(); at += piece) {
    const size_t n = std::min(piece, base.size() - at);
    auto into = std::span{base}.subspan(at, n);
    if (dense) {
      if (auto ok = a.apply(into, scratch); !ok)
        return ok;
      std::copy_n(scratch.begin(), n, dense->begin() + static_cast<ptrdiff_t>(at));
    } else if (auto ok = a.apply(into); !ok) {
      return ok;
    }
  }
  return a.finish();
}

/// XOR bytes with the shapes run lists must get right: zeros at both ends,
/// zero stretches just under and at `sparse_min_gap`, dense stretches.
std::vector<std::byte> tricky_xor(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<std::byte> x(n, std::byte{0});
  size_t at = rng() % 11;
  while (at < n) {
    const size_t lit = 1 + rng() % (rng() % 4 == 0 ? 300 : 5);
    for (size_t k = 0; k < lit && at < n; ++k, ++at)
      x[at] = static_cast<std::byte>(1 + rng() % 255);
    const size_t choice = rng() % 4;
    at += choice == 0 ? dc::sparse_min_gap - 1 : choice == 1 ? dc::sparse_min_gap : rng() % 200;
  }
  return x;
}

} // namespace

/// The run list of `x` as the format describes it, a byte at a time: a
/// maximal zero stretch is a gap when it is sparse_min_gap long or more or
/// touches either end; the bytes between gaps are literals.
std::vector<std::byte> reference_runs(const std::vector<std::byte>& x) {
  const size_t n = x.size();
  std::vector<bool> gap(n, false);
  for (size_t a = 0; a < n;) {
    if (x[a] != std::byte{0}) {
      ++a;
      continue;
    }
    size_t b = a;
    while (b < n && x[b] == std::byte{0})
      ++b;
    if (b - a >= dc::sparse_min_gap || a == 0 || b == n)
      std::fill(gap.begin() + static_cast<ptrdiff_t>(a), gap.begin() + static_cast<ptrdiff_t>(b),
                true);
    a = b;
  }
  std::vector<std::byte> out;
  auto put = [&](uint64_t v) {
    for (; v >= 0x80; v >>= 7)
      out.push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
    out.push_back(static_cast<std::byte>(v));
  };
  size_t at = 0;
  while (at < n) {
    size_t g = at;
    while (g < n && gap[g])
      ++g;
    size_t l = g;
    while (l < n && !gap[l])
      ++l;
    put(g - at);
    put(l - g);
    out.insert(out.end(), x.begin() + static_cast<ptrdiff_t>(g),
               x.begin() + static_cast<ptrdiff_t>(l));
    at = l;
  }
  return out;
}

TEST(delta_sparse, the_encoder_writes_the_run_list_the_format_describes) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{63}, size_t{64}, size_t{65}, size_t{127},
                   size_t{128}, size_t{129}, size_t{5000}}) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
      auto x = tricky_xor(n, seed);
      EXPECT_EQ(runs_of(x, n), reference_runs(x)) << n << " " << seed;
      // Zeros on both ends, shorter than a gap, across 64-byte boundaries.
      std::mt19937 rng{seed};
      for (auto& b : x)
        b = rng() % 3 == 0 ? std::byte{0} : static_cast<std::byte>(1 + rng() % 255);
      EXPECT_EQ(runs_of(x, n), reference_runs(x)) << n << " " << seed << " (dense)";
    }
  }
  std::vector<std::byte> zeros(200, std::byte{0});
  EXPECT_EQ(runs_of(zeros, zeros.size()), reference_runs(zeros));
}

TEST(delta_sparse, run_lists_round_trip_in_any_pieces) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4099}, size_t{100'003}}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      auto old_bytes = random_bytes(n, seed);
      auto x = tricky_xor(n, seed);
      auto expected = old_bytes;
      for (size_t i = 0; i < n; ++i)
        expected[i] ^= x[i];
      for (size_t encode_piece : {size_t{1}, size_t{13}, size_t{4096}, n}) {
        auto runs = runs_of(x, encode_piece);
        for (size_t apply_piece : {size_t{1}, size_t{9}, size_t{1000}, n}) {
          for (auto [step, buffer] : {std::pair{size_t{1}, size_t{80}},
                                      {size_t{7}, size_t{97}},
                                      {size_t{1} << 20, size_t{64} << 10}}) {
            auto base = old_bytes;
            std::vector<std::byte> dense(n, std::byte{0xee});
            ASSERT_TRUE(apply_runs(base, runs, apply_piece, step, buffer, &dense))
              << n << " " << seed << " " << encode_piece << " " << apply_piece << " " << step;
            ASSERT_EQ(base, expected) << n << " " << encode_piece << " " << apply_piece;
            ASSERT_EQ(dense, x) << n << " " << encode_piece << " " << apply_piece;
          }
        }
      }
    }
  }
}

TEST(delta_sparse, a_sparse_delta_costs_per_change_and_short_zero_stretches_stay_literal) {
  // A changed byte about every 800: about four run-list bytes per change.
  auto old_bytes = random_bytes(1 << 20, 4);
  auto now = sparse_update(old_bytes, 5);
  std::vector<std::byte> x(old_bytes.size());
  ASSERT_TRUE(dc::xor_encode(old_bytes, now, x));
  const size_t changed = static_cast<size_t>(
    std::count_if(x.begin(), x.end(), [](std::byte b) { return b != std::byte{0}; }));
  ASSERT_GT(changed, 1000u);
  auto runs = runs_of(x, x.size());
  EXPECT_LE(runs.size(), 5 * changed);
  EXPECT_GE(runs.size(), 3 * changed);

  // A stretch of sparse_min_gap - 1 zeros inside changed bytes is literal:
  // one run (gap 2, the two changed bytes and the zeros between them as
  // literals) and one for the three trailing zeros.
  const size_t g = dc::sparse_min_gap;
  std::vector<std::byte> y(2 + 1 + (g - 1) + 1 + 3, std::byte{0});
  y[2] = y[2 + g] = std::byte{7};
  std::vector<std::byte> expected_short{std::byte{2}, static_cast<std::byte>(g + 1), std::byte{7}};
  expected_short.insert(expected_short.end(), g - 1, std::byte{0});
  expected_short.insert(expected_short.end(), {std::byte{7}, std::byte{3}, std::byte{0}});
  EXPECT_EQ(runs_of(y, y.size()), expected_short);
  // sparse_min_gap zeros split it into two runs.
  std::vector<std::byte> z(1 + dc::sparse_min_gap + 1, std::byte{0});
  z.front() = z.back() = std::byte{9};
  const std::vector<std::byte> expected_split{std::byte{0}, std::byte{1},
                                              std::byte{9}, static_cast<std::byte>(g),
                                              std::byte{1}, std::byte{9}};
  EXPECT_EQ(runs_of(z, z.size()), expected_split);

  std::array<std::byte, 11> zero_run{};
  ASSERT_EQ(dc::sparse_encode_zeros(300, zero_run), 3u);
  EXPECT_EQ(zero_run[0], std::byte{0xac});
  EXPECT_EQ(zero_run[1], std::byte{0x02});
  EXPECT_EQ(zero_run[2], std::byte{0});
}

TEST(delta_sparse, hostile_run_lists_are_decode_failures) {
  auto check = [](std::vector<std::byte> runs, size_t n, const char* says) {
    std::vector<std::byte> base(n, std::byte{1});
    auto ok = apply_runs(base, std::move(runs), n, 1 << 20, 64 << 10);
    ASSERT_FALSE(ok) << says;
    EXPECT_EQ(ok.error().code, errc::decode_failure) << says;
    EXPECT_THAT(ok.error().message, HasSubstr(says));
  };
  using b = std::byte;
  check({b{5}, b{6}, b{1}, b{1}, b{1}, b{1}, b{1}, b{1}}, 10, "past the tensor's 10");
  check({b{0}, b{0}, b{10}, b{0}}, 10, "covers no bytes");
  check({b{4}, b{0}}, 10, "ends at byte 4 of 10");
  check({b{4}, b{3}, b{1}}, 10, "ends inside a run");
  check({b{4}, b{0x80}}, 10, "truncated inside a run");
  check({b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0x02},
         b{0}},
        10, "not a valid varint");
  check({b{10}, b{0}, b{1}, b{0}}, 10, "bytes follow");
  // A huge gap does not wrap around the size checks.
  check({b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0xff}, b{0x01},
         b{0x05}},
        10, "past the tensor's 10");

  dc::sparse_applier a{10, feed({std::byte{10}, std::byte{0}}, 1)};
  std::vector<std::byte> base(4);
  ASSERT_TRUE(a.apply(base));
  auto early = a.finish();
  ASSERT_FALSE(early);
  EXPECT_THAT(early.error().message, HasSubstr("applied to 4 of 10"));
  std::vector<std::byte> more(7);
  EXPECT_FALSE(a.apply(more));
}

TEST(delta_sparse, concatenated_frames_of_unknown_size_read_in_pieces) {
  auto x = tricky_xor(50'000, 9);
  auto runs = runs_of(x, 4096);
  // One frame per 10000 bytes of run list, as the publisher writes per chunk.
  std::vector<std::byte> frames;
  for (size_t at = 0; at < runs.size(); at += 10'000) {
    auto f = dc::compress(std::span{runs}.subspan(at, std::min<size_t>(10'000, runs.size() - at)),
                          1, dc::finder::literals);
    ASSERT_TRUE(f);
    frames.insert(frames.end(), f->begin(), f->end());
  }
  auto z = dc::stream_decompressor::start(UINT64_MAX, feed(frames, 333), 100);
  ASSERT_TRUE(z);
  auto zstd = std::make_shared<dc::stream_decompressor>(std::move(*z));
  dc::sparse_applier a{x.size(),
                       [zstd](std::span<std::byte> into) { return zstd->read_some(into); }};
  std::vector<std::byte> base(x.size(), std::byte{0});
  ASSERT_TRUE(a.apply(base));
  ASSERT_TRUE(a.finish());
  EXPECT_EQ(base, x);

  // The same frames cut short: a decode failure, not a short read.
  frames.resize(frames.size() - 3);
  auto cut = dc::stream_decompressor::start(UINT64_MAX, feed(frames, 1 << 20));
  ASSERT_TRUE(cut);
  std::vector<std::byte> out(runs.size() + 100);
  auto got = cut->read_some(out);
  ASSERT_FALSE(got);
  EXPECT_THAT(got.error().message, HasSubstr("truncated"));
}
