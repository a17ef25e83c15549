#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/core/error.hpp"

/// The delta encodings of DESIGN §1 (`xor`, `overwrite`) and the optional
/// `zstd` compression of encoded tensor bytes.
namespace stitch::delta {

/// `out = old_bytes ^ new_bytes`; all three sizes must match
/// (`invalid_argument` otherwise). `out` may alias either input.
status xor_encode(std::span<const std::byte> old_bytes, std::span<const std::byte> new_bytes,
                  std::span<std::byte> out);

/// `base ^= delta` in place, turning the old bytes into the new ones; the
/// sizes must match (`decode_failure` otherwise: the delta is not for this
/// tensor).
status xor_apply(std::span<std::byte> base, std::span<const std::byte> delta);

/// Replaces `base` by `replacement`; the sizes must match (`decode_failure`).
status overwrite_apply(std::span<std::byte> base, std::span<const std::byte> replacement);

/// zstd levels accepted by `compress` (negative levels are zstd's fast modes).
int min_level() noexcept;
int max_level() noexcept;

/// One zstd frame holding `bytes`, with its content size recorded. A level
/// outside [min_level(), max_level()] is `invalid_argument`.
result<std::vector<std::byte>> compress(std::span<const std::byte> bytes, int level = 3);

/// Decompresses one or more zstd frames that must hold exactly
/// `expected_size` bytes. Frames declaring or producing more, truncated or
/// corrupt input, and fewer bytes than expected are `decode_failure`; at most
/// `expected_size` bytes are ever allocated.
result<std::vector<std::byte>> decompress(std::span<const std::byte> frame, uint64_t expected_size);

/// Like `decompress`, into a caller's buffer of exactly the expected size.
status decompress_into(std::span<const std::byte> frame, std::span<std::byte> out);

} // namespace stitch::delta
