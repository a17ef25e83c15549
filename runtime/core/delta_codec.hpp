#pragma once

#include <functional>
#include <memory>

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

/// One zstd frame holding `bytes`, with its content size recorded, its
/// matches found by the XOR delta match finder (zstd's own for blocks that
/// are not mostly zero runs). A level outside [min_level(), max_level()] is
/// `invalid_argument`.
result<std::vector<std::byte>> compress(std::span<const std::byte> bytes, int level = 3);

/// Decompresses one or more zstd frames that must hold exactly
/// `expected_size` bytes. Frames declaring or producing more, truncated or
/// corrupt input, and fewer bytes than expected are `decode_failure`; at most
/// `expected_size` bytes are ever allocated.
result<std::vector<std::byte>> decompress(std::span<const std::byte> frame, uint64_t expected_size);

/// Like `decompress`, into a caller's buffer of exactly the expected size.
status decompress_into(std::span<const std::byte> frame, std::span<std::byte> out);

/// Largest zstd window a stream decompressor accepts (a hostile frame cannot
/// make it allocate more).
inline constexpr int max_window_log = 25;

/// Compresses one tensor's bytes as they arrive into one zstd frame, in the
/// format `compress` writes (content size and checksum recorded), holding
/// only zstd's window. Appends output to the caller's buffer.
class stream_compressor {
public:
  /// A frame of exactly `total_size` input bytes at `level`. Without
  /// `workers` it compresses on the caller's thread with a match finder made
  /// for XOR deltas (zero runs; zstd's own finder for dense blocks), as
  /// `compress` does. With `workers`, zstd compresses on that many threads
  /// of its own, with its own finder, while the caller goes on (same format;
  /// zstd builds without threads compress inline).
  static result<stream_compressor> start(uint64_t total_size, int level, int workers = 0);
  stream_compressor(stream_compressor&&) noexcept;
  stream_compressor& operator=(stream_compressor&&) noexcept;
  ~stream_compressor();

  status update(std::span<const std::byte> in, std::vector<std::byte>& out);
  /// Ends the frame; `invalid_argument` unless `total_size` bytes arrived.
  status finish(std::vector<std::byte>& out);
  /// Starts the next frame, of `total_size` bytes, on the same context (its
  /// buffers and threads are kept); any frame in progress is dropped.
  status restart(uint64_t total_size);

private:
  struct state;
  explicit stream_compressor(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// Where a stream decompressor pulls compressed bytes from: fills `into`
/// (or less) and answers how many; 0 means the input ended.
using compressed_input = std::function<result<size_t>(std::span<std::byte> into)>;

/// Decompresses one frame's worth of `expected_size` bytes piece by piece
/// into caller buffers, pulling input as it needs it; memory stays at zstd's
/// window (at most 2^`max_window_log`) plus a small input buffer. Corrupt or
/// truncated input, more or fewer bytes than expected, and input left over
/// after the frame are `decode_failure`.
class stream_decompressor {
public:
  /// Pulls input in pieces of `input_buffer` bytes (0: zstd's suggestion).
  static result<stream_decompressor> start(uint64_t expected_size, compressed_input input,
                                           size_t input_buffer = 0);
  stream_decompressor(stream_decompressor&&) noexcept;
  stream_decompressor& operator=(stream_decompressor&&) noexcept;
  ~stream_decompressor();

  /// Fills `out` exactly with the next decompressed bytes.
  status read(std::span<std::byte> out);
  /// Checks that every expected byte came out and the input is exhausted.
  status finish();

private:
  struct state;
  explicit stream_decompressor(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

} // namespace stitch::delta
