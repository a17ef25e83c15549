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

/// Which match finder a compressor uses: the XOR delta finder (zero runs;
/// zstd's own for blocks that are not mostly zero runs), zstd's own, or
/// none (`literals`: every byte a Huffman-coded literal, for `xor-sparse`
/// run lists, whose bytes seldom repeat in long strings: on codec_bench's
/// shapes that compresses 2.5-3.7x faster and decodes about 2x faster than
/// zstd's own finder, for 1-6% more bytes).
enum class finder : uint8_t { xor_delta, plain, literals };

/// One zstd frame holding `bytes`, with its content size recorded, its
/// matches found by `f`. A level outside [min_level(), max_level()] is
/// `invalid_argument`.
result<std::vector<std::byte>> compress(std::span<const std::byte> bytes, int level = 3,
                                        finder f = finder::xor_delta);

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
  /// `workers` it compresses on the caller's thread with the match finder
  /// `f`, as `compress` does. With `workers`, zstd compresses on that many
  /// threads of its own, with its own finder, while the caller goes on (same
  /// format; zstd builds without threads compress inline).
  static result<stream_compressor> start(uint64_t total_size, int level, int workers = 0,
                                         finder f = finder::xor_delta);
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
  /// Fills `out` with the next decompressed bytes, fewer only where the
  /// input ends; answers how many (0: the input ended after whole frames).
  /// For data of unknown size (start it with the most it may hold); a
  /// truncated or corrupt frame is `decode_failure`.
  result<size_t> read_some(std::span<std::byte> out);
  /// Checks that every expected byte came out and the input is exhausted.
  status finish();

private:
  struct state;
  explicit stream_decompressor(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// The `xor-sparse` delta encoding (DESIGN §1): an XOR delta as a *run
/// list*, so that applying it costs per changed stretch of bytes, not per
/// byte of the tensor (a sparse XOR delta is mostly zeros, and zstd decodes
/// each zero run of it as a match of its own: a 1%-dense delta is about ten
/// million of them per GB).
///
/// A run list is runs back to back, each: `gap` (unsigned LEB128), `length`
/// (unsigned LEB128), then `length` literal bytes. A run stands for `gap`
/// zero bytes of the XOR followed by its literal bytes. Every run covers at
/// least one byte; the runs of a tensor cover exactly its bytes, in order.
/// The encoder ends a literal stretch only at `sparse_min_gap` or more zero
/// bytes (shorter zero stretches cost less as literals than as a new run),
/// and closes each piece it encodes with a run of its trailing zeros, so
/// pieces encode independently and their run lists concatenate.

/// Zero stretches shorter than this stay inside a run's literal bytes. 3:
/// on the XOR of a bf16 optimizer step (codec_bench) the run list then
/// stores 4% less than `xor` does, at 4 2% more, at 8 15% more; on a sparse
/// delta it makes no difference.
inline constexpr size_t sparse_min_gap = 3;

/// Room `sparse_encode` may need for `n` bytes.
size_t sparse_encode_bound(size_t n) noexcept;

/// Writes the run list of `xored` (covering exactly its bytes) to the
/// front of `out`, which holds at least `sparse_encode_bound(xored.size())`
/// bytes; answers how many it wrote.
size_t sparse_encode(std::span<const std::byte> xored, std::span<std::byte> out) noexcept;

/// Writes the run list of `count` zero bytes (one run; at most 11 bytes).
size_t sparse_encode_zeros(uint64_t count, std::span<std::byte, 11> out) noexcept;

/// Applies a tensor's run list to its bytes piece by piece, pulling the run
/// list from `runs` as it goes (a decompressor, or stored bytes), in a
/// buffer of its own: memory stays at that buffer whatever the tensor size.
/// Runs covering more than the tensor, a run covering nothing, a run list
/// ending early and bytes after the last run are `decode_failure`.
class sparse_applier {
public:
  sparse_applier(uint64_t total_size, compressed_input runs, size_t buffer_bytes = 64 << 10);

  /// XORs the run list into the next `base.size()` bytes of the tensor.
  /// With `dense` (at least as large), also writes the XOR bytes of that
  /// piece there, zeros included.
  status apply(std::span<std::byte> base, std::span<std::byte> dense = {});
  /// Checks that the runs covered the whole tensor and nothing follows.
  status finish();

private:
  status refill(size_t want);

  uint64_t total_ = 0;
  uint64_t pos_ = 0;
  uint64_t gap_left_ = 0;
  uint64_t literal_left_ = 0;
  compressed_input input_;
  std::vector<std::byte> buffer_;
  size_t head_ = 0;
  size_t tail_ = 0;
  bool input_ended_ = false;
};

} // namespace stitch::delta
