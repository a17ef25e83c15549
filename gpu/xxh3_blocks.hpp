#pragma once

#include <cstddef>
#include <cstdint>

/// XXH3-64 (seed 0, the default secret) of inputs longer than 240 bytes,
/// split so that a GPU can compute it in parallel and still give exactly the
/// value of `XXH3_64bits`.
///
/// XXH3's long path keeps eight 64-bit accumulators. Every 64-byte stripe
/// adds a term to each of them, and after every 1 KiB block (16 stripes) the
/// accumulators are scrambled. The additions commute, so the 16 terms of a
/// block can be computed by 16 threads and summed in any order; only the
/// scramble after each block is a sequential chain, one cheap step per KiB
/// and lane. Each stripe term of lanes 2k and 2k+1 reads only the stripe's
/// k-th 16 bytes, so `pair_block_sums` sums one such pair of lanes over a
/// whole block from 16 aligned 16-byte loads; `chain_step` is one scramble
/// of a lane's chain, `lane_tail` adds the tail's stripes and the final
/// stripe, `merge` folds the eight lanes into the digest. The CPU test
/// (`tests/gpu/device_memory_test.cpp`) checks this decomposition against
/// libxxhash; the kernel (`gpu/checksum_kernel.cu`) runs the same functions.
#if defined(__CUDACC__)
#define STITCH_HD __host__ __device__ __forceinline__
#else
#define STITCH_HD inline
#endif

namespace stitch::gpu::xxh3 {

inline constexpr size_t stripe_len = 64;
inline constexpr size_t secret_size = 192;
inline constexpr size_t stripes_per_block = (secret_size - stripe_len) / 8; // 16
inline constexpr size_t block_len = stripe_len * stripes_per_block;         // 1024
inline constexpr size_t midsize_max = 240;
inline constexpr size_t lanes = 8;

inline constexpr uint64_t prime32_1 = 0x9E3779B1U;
inline constexpr uint64_t prime32_2 = 0x85EBCA77U;
inline constexpr uint64_t prime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t prime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t prime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t prime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t prime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t prime64_5 = 0x27D4EB2F165667C5ULL;

/// XXH3's default secret (`XXH3_kSecret`) as little-endian 64-bit words at
/// every byte offset a stripe uses: `secret_word(offset)` is the 8 bytes at
/// `offset`. Offsets used are multiples of 8 (stripes, scramble), 7 (the
/// last stripe: 192 - 64 - 7 = 121) and 11 (the merge).
struct secret_bytes {
  unsigned char b[secret_size];
};

STITCH_HD uint64_t secret_word(const unsigned char* secret, size_t offset) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | secret[offset + static_cast<size_t>(i)];
  return v;
}

STITCH_HD uint64_t initial_acc(size_t lane) {
  switch (lane) {
    case 0: return prime32_3;
    case 1: return prime64_1;
    case 2: return prime64_2;
    case 3: return prime64_3;
    case 4: return prime64_4;
    case 5: return prime32_2;
    case 6: return prime64_5;
    default: return prime32_1;
  }
}

/// The key of `lane` for a stripe that reads the secret at `secret_offset`
/// (stripe s of a block reads it at 8 s).
STITCH_HD uint64_t stripe_key(const unsigned char* secret, size_t secret_offset, size_t lane) {
  return secret_word(secret, secret_offset + 8 * lane);
}

/// The term stripe `words` (8 little-endian words) adds to accumulator
/// `lane`: word lane^1 plus the 32x32 product of the halves of
/// (word lane ^ key).
STITCH_HD uint64_t stripe_term(const uint64_t* words, uint64_t key, size_t lane) {
  uint64_t k = words[lane] ^ key;
  return words[lane ^ 1] + (k & 0xFFFFFFFFULL) * (k >> 32);
}

/// The secret word lane `lane`'s scramble uses.
STITCH_HD uint64_t scramble_key(const unsigned char* secret, size_t lane) {
  return secret_word(secret, secret_size - stripe_len + 8 * lane);
}

STITCH_HD uint64_t scramble(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * prime32_1;
}

/// Full blocks of an input of `len` (> 240) bytes: each is followed by a scramble.
STITCH_HD size_t full_blocks(size_t len) {
  return (len - 1) / block_len;
}

/// Stripes of the last, unscrambled block (before the final stripe).
STITCH_HD size_t tail_stripes(size_t len) {
  return ((len - 1) - block_len * full_blocks(len)) / stripe_len;
}

STITCH_HD uint64_t mul128_fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  __extension__ using u128 = unsigned __int128;
  u128 p = static_cast<u128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

STITCH_HD uint64_t avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}

/// Folds the eight finished accumulators of an input of `len` bytes.
STITCH_HD uint64_t merge(const uint64_t* acc, const unsigned char* secret, size_t len) {
  uint64_t result = static_cast<uint64_t>(len) * prime64_1;
  for (size_t i = 0; i < 4; ++i)
    result += mul128_fold64(acc[2 * i] ^ secret_word(secret, 11 + 16 * i),
                            acc[2 * i + 1] ^ secret_word(secret, 11 + 16 * i + 8));
  return avalanche(result);
}

/// Reads stripe words (little-endian). On the device, word loads where `p`
/// is 8-byte aligned (every stripe but a chunk's final one when its length
/// is not a multiple of 8), byte loads otherwise.
STITCH_HD void load_stripe(const unsigned char* p, uint64_t* words) {
#if defined(__CUDA_ARCH__)
  if (reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    const auto* w = reinterpret_cast<const uint64_t*>(p);
    for (size_t i = 0; i < lanes; ++i)
      words[i] = w[i];
    return;
  }
#endif
  for (size_t i = 0; i < lanes; ++i) {
    uint64_t v = 0;
    for (int j = 7; j >= 0; --j)
      v = (v << 8) | p[8 * i + static_cast<size_t>(j)];
    words[i] = v;
  }
}

/// The 8 bytes at `p` (8-byte aligned on the device), little-endian.
STITCH_HD uint64_t load_word(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint64_t*>(p);
#else
  uint64_t v = 0;
  for (int j = 7; j >= 0; --j)
    v = (v << 8) | p[static_cast<size_t>(j)];
  return v;
#endif
}

/// The sums, over the 16 stripes of the block at `block`, of the terms of
/// lanes 2k and 2k+1 (`keys[s * lanes + lane]` is stripe s's key of a lane).
/// On the device with `aligned16`, one 16-byte load per stripe; otherwise
/// two 8-byte ones (the block must then be 8-byte aligned).
STITCH_HD void pair_block_sums(const unsigned char* block, const uint64_t* keys, size_t k,
                               bool aligned16, uint64_t& sum_even, uint64_t& sum_odd) {
  // Loads in batches of 8, issued before their terms use them, so that
  // enough of them are in flight to keep the memory busy.
  constexpr size_t batch = 8;
  uint64_t even = 0;
  uint64_t odd = 0;
  const unsigned char* p = block + 16 * k;
  for (size_t s0 = 0; s0 < stripes_per_block; s0 += batch) {
    uint64_t w[batch][2];
#if defined(__CUDA_ARCH__)
    if (aligned16) {
#pragma unroll
      for (size_t i = 0; i < batch; ++i) {
        const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p + (s0 + i) * stripe_len));
        w[i][0] = v.x;
        w[i][1] = v.y;
      }
    } else
#endif
    {
      (void) aligned16;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (size_t i = 0; i < batch; ++i) {
        w[i][0] = load_word(p + (s0 + i) * stripe_len);
        w[i][1] = load_word(p + (s0 + i) * stripe_len + 8);
      }
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (size_t i = 0; i < batch; ++i) {
      even += stripe_term(w[i], keys[(s0 + i) * lanes + 2 * k], 0);
      odd += stripe_term(w[i], keys[(s0 + i) * lanes + 2 * k + 1], 1);
    }
  }
  sum_even = even;
  sum_odd = odd;
}

/// One link of a lane's chain: a full block's summed term, then the scramble.
STITCH_HD uint64_t chain_step(uint64_t acc, uint64_t block_sum, uint64_t key) {
  return scramble(acc + block_sum, key);
}

/// A lane's accumulator after its chain over the full blocks: the tail's
/// stripes and the final stripe, read from `input` directly.
STITCH_HD uint64_t lane_tail(uint64_t acc, const unsigned char* input, size_t len,
                             const unsigned char* secret, size_t lane) {
  uint64_t words[lanes];
  const size_t blocks = full_blocks(len);
  const size_t tail = tail_stripes(len);
  for (size_t s = 0; s < tail; ++s) {
    load_stripe(input + blocks * block_len + s * stripe_len, words);
    acc += stripe_term(words, stripe_key(secret, s * 8, lane), lane);
  }
  load_stripe(input + len - stripe_len, words);
  return acc + stripe_term(words, stripe_key(secret, secret_size - stripe_len - 7, lane), lane);
}

} // namespace stitch::gpu::xxh3

namespace stitch::gpu {
/// XXH3's default secret, `XXH3_kSecret` of xxhash.h (the algorithm's constant).
inline constexpr xxh3::secret_bytes xxh3_default_secret = {{
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
  0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
  0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
  0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
  0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
  0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
  0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
  0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
  0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
  0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
  0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
  0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}};
} // namespace stitch::gpu
