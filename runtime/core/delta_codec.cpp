#include "runtime/core/delta_codec.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

// The block-level sequence producer API (zstd >= 1.5.4) is in zstd's
// advanced section; Debian's shared library exports it.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace stitch::delta {

namespace {

// GCC's vector extension: 16-byte lanes (SSE2/NEON baseline) without
// intrinsics, so the loop is SIMD at -O2 where auto-vectorization is not.
using lane = uint64_t __attribute__((vector_size(16)));

/// `out[i] = a[i] ^ b[i]`; `out` may equal `a` or `b`.
void xor_bytes(std::byte* out, const std::byte* a, const std::byte* b, size_t n) noexcept {
  constexpr size_t block = 4 * sizeof(lane);
  size_t i = 0;
  for (; i + block <= n; i += block) {
    lane x[4];
    lane y[4];
    std::memcpy(x, a + i, block);
    std::memcpy(y, b + i, block);
    for (int k = 0; k < 4; ++k)
      x[k] ^= y[k];
    std::memcpy(out + i, x, block);
  }
  for (; i < n; ++i)
    out[i] = a[i] ^ b[i];
}

/// The index of the first byte in [from, n) that is zero (`zero`) or not
/// zero, n if none: 16 bytes a step where SSE2 is there, 8 otherwise.
template <bool zero>
size_t find_byte(const unsigned char* s, size_t from, size_t n) noexcept {
  size_t at = from;
#if defined(__SSE2__)
  const __m128i zeros = _mm_setzero_si128();
  for (; at + 16 <= n; at += 16) {
    const auto v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + at));
    unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zeros)));
    if constexpr (!zero)
      mask = ~mask & 0xffffu;
    if (mask)
      return at + static_cast<size_t>(__builtin_ctz(mask));
  }
#else
  constexpr uint64_t low = 0x0101010101010101ull, high = 0x8080808080808080ull;
  for (; at + 8 <= n; at += 8) {
    uint64_t w;
    std::memcpy(&w, s + at, sizeof w);
    // The lowest flagged byte of (w - low) & ~w & high is w's first zero.
    const uint64_t hit = zero ? (w - low) & ~w & high : w;
    if (hit)
      return at + static_cast<size_t>(__builtin_ctzll(hit)) / 8;
  }
#endif
  while (at < n && (s[at] == 0) != zero)
    ++at;
  return at;
}

/// zstd's match finder for XOR deltas (a block-level sequence producer): an
/// XOR delta is mostly zero runs, and a zero run is a match at offset 1 once
/// one zero byte precedes it, so the parse is one scan for zero runs of 4
/// bytes or more, each the literals before it plus its first zero, then the
/// rest of the run copied from offset 1. That is most of what zstd's own
/// finder would spend its time discovering; zstd still entropy-codes the
/// literals and sequences and writes a standard frame. A block whose zero
/// runs cover less than half of it answers an error, and zstd's own finder
/// (enabled as the fallback) compresses that block instead.
size_t xor_zero_runs(void*, ZSTD_Sequence* out, size_t capacity, const void* source, size_t n,
                     const void*, size_t, int, size_t) {
  const auto* s = static_cast<const unsigned char*>(source);
  size_t pos = 0, literals = 0, k = 0, covered = 0;
  while (pos < n) {
    pos = find_byte<true>(s, pos, n);
    if (pos >= n)
      break;
    const size_t end = find_byte<false>(s, pos + 1, n);
    if (end - pos >= 4) {
      // One sequence per run and one for the last literals: within the
      // ZSTD_sequenceBound zstd guarantees, checked all the same.
      if (k + 2 > capacity)
        return ZSTD_SEQUENCE_PRODUCER_ERROR;
      out[k++] = ZSTD_Sequence{1, static_cast<unsigned>(pos + 1 - literals),
                               static_cast<unsigned>(end - pos - 1), 0};
      covered += end - pos - 1;
      literals = end;
    }
    pos = end;
    // Dense bytes: give the block to zstd's own finder early.
    if (pos >= n / 4 && covered < pos / 2 && pos < n)
      return ZSTD_SEQUENCE_PRODUCER_ERROR;
  }
  if (covered < n / 2)
    return ZSTD_SEQUENCE_PRODUCER_ERROR;
  out[k++] = ZSTD_Sequence{0, static_cast<unsigned>(n - literals), 0, 0};
  return k;
}

/// A block-level sequence producer that finds no matches: the block is one
/// run of literals, which zstd Huffman-codes.
size_t no_matches(void*, ZSTD_Sequence* out, size_t capacity, const void*, size_t n, const void*,
                  size_t, int, size_t) {
  if (capacity < 1)
    return ZSTD_SEQUENCE_PRODUCER_ERROR;
  out[0] = ZSTD_Sequence{0, static_cast<unsigned>(n), 0, 0};
  return 1;
}

/// Level, frame checksum and, for a context compressing on the calling
/// thread, the finder `f` (zstd runs external finders only without worker
/// threads).
void configure(ZSTD_CCtx* cctx, int level, int workers, finder f) {
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  // The frame checksum turns corruption into an error instead of wrong bytes.
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  if (workers > 0) {
    (void) ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, workers);
    return;
  }
  if (f == finder::plain)
    return;
  ZSTD_registerSequenceProducer(cctx, nullptr,
                                f == finder::literals ? &no_matches : &xor_zero_runs);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_enableSeqProducerFallback, 1);
  // External finders cannot work with long-distance matching; keep it off
  // whatever the level would choose.
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_enableLongDistanceMatching, ZSTD_ps_disable);
}

error decode_error(std::string message) {
  return make_error(errc::decode_failure, std::move(message));
}

} // namespace

status xor_encode(std::span<const std::byte> old_bytes, std::span<const std::byte> new_bytes,
                  std::span<std::byte> out) {
  if (old_bytes.size() != new_bytes.size() || out.size() != old_bytes.size())
    return make_error(errc::invalid_argument, "xor_encode needs equal sizes, got old "
                                                + std::to_string(old_bytes.size()) + ", new "
                                                + std::to_string(new_bytes.size()) + ", out "
                                                + std::to_string(out.size()));
  xor_bytes(out.data(), old_bytes.data(), new_bytes.data(), out.size());
  return {};
}

status xor_apply(std::span<std::byte> base, std::span<const std::byte> delta) {
  if (base.size() != delta.size())
    return decode_error("xor delta has " + std::to_string(delta.size())
                        + " bytes but the tensor has " + std::to_string(base.size()));
  xor_bytes(base.data(), base.data(), delta.data(), base.size());
  return {};
}

status overwrite_apply(std::span<std::byte> base, std::span<const std::byte> replacement) {
  if (base.size() != replacement.size())
    return decode_error("overwrite delta has " + std::to_string(replacement.size())
                        + " bytes but the tensor has " + std::to_string(base.size()));
  if (!base.empty())
    std::memmove(base.data(), replacement.data(), base.size());
  return {};
}

int min_level() noexcept {
  return ZSTD_minCLevel();
}

int max_level() noexcept {
  return ZSTD_maxCLevel();
}

result<std::vector<std::byte>> compress(std::span<const std::byte> bytes, int level, finder f) {
  if (level < min_level() || level > max_level())
    return make_error(errc::invalid_argument, "zstd level " + std::to_string(level)
                                                + " is outside [" + std::to_string(min_level())
                                                + ", " + std::to_string(max_level()) + "]");
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx{ZSTD_createCCtx(), &ZSTD_freeCCtx};
  if (!cctx)
    return make_error(errc::limit_exceeded, "out of memory creating a zstd context");
  configure(cctx.get(), level, 0, f);
  // Uninitialized worst-case room: a sparse delta only ever touches the few
  // pages its small frame needs, where a zeroed vector would fault in all.
  size_t bound = ZSTD_compressBound(bytes.size());
  std::unique_ptr<std::byte[]> room{new (std::nothrow) std::byte[bound]};
  if (!room)
    return make_error(errc::limit_exceeded, "out of memory for the compressed bytes");
  size_t n = ZSTD_compress2(cctx.get(), room.get(), bound, bytes.data(), bytes.size());
  if (ZSTD_isError(n))
    return make_error(errc::invalid_argument,
                      std::string{"zstd compression failed: "} + ZSTD_getErrorName(n));
  return std::vector<std::byte>(room.get(), room.get() + n);
}

status decompress_into(std::span<const std::byte> frame, std::span<std::byte> out) {
  if (frame.empty())
    return decode_error("empty input is not a zstd frame");
  unsigned long long declared = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    return decode_error("input is not a zstd frame (bad or truncated frame header)");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > out.size())
    return decode_error("zstd frame declares " + std::to_string(declared)
                        + " bytes, more than the expected " + std::to_string(out.size()));
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx{ZSTD_createDCtx(), &ZSTD_freeDCtx};
  if (!dctx)
    return make_error(errc::limit_exceeded, "out of memory creating a zstd context");
  // One-shot decoding uses `out` as its window: nothing beyond it is allocated
  // and output past its end is an error, not a reallocation.
  size_t n = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(), frame.data(), frame.size());
  if (ZSTD_isError(n)) {
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall)
      return decode_error("zstd data holds more than the expected " + std::to_string(out.size())
                          + " bytes");
    return decode_error(std::string{"zstd data is corrupt or truncated: "} + ZSTD_getErrorName(n));
  }
  if (n != out.size())
    return decode_error("zstd data holds " + std::to_string(n) + " bytes, fewer than the expected "
                        + std::to_string(out.size()));
  return {};
}

result<std::vector<std::byte>> decompress(std::span<const std::byte> frame,
                                          uint64_t expected_size) {
  if (frame.empty())
    return decode_error("empty input is not a zstd frame");
  unsigned long long declared = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    return decode_error("input is not a zstd frame (bad or truncated frame header)");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > expected_size)
    return decode_error("zstd frame declares " + std::to_string(declared)
                        + " bytes, more than the expected " + std::to_string(expected_size));
  std::vector<std::byte> out;
  try {
    out.resize(expected_size);
  } catch (const std::exception&) {
    return make_error(errc::limit_exceeded,
                      "cannot allocate " + std::to_string(expected_size) + " bytes to decompress");
  }
  if (auto ok = decompress_into(frame, out); !ok)
    return std::move(ok).error();
  return out;
}

struct stream_compressor::state {
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx{ZSTD_createCCtx(), &ZSTD_freeCCtx};
  uint64_t total = 0;
  uint64_t seen = 0;
  /// Where zstd writes before the bytes are appended to the caller's
  /// vector (growing that vector by a block's room at every call would
  /// zero-fill the room each time).
  std::vector<std::byte> room = std::vector<std::byte>(ZSTD_CStreamOutSize());
};

stream_compressor::stream_compressor(std::unique_ptr<state> s) : s_(std::move(s)) {}
stream_compressor::stream_compressor(stream_compressor&&) noexcept = default;
stream_compressor& stream_compressor::operator=(stream_compressor&&) noexcept = default;
stream_compressor::~stream_compressor() = default;

result<stream_compressor> stream_compressor::start(uint64_t total_size, int level, int workers,
                                                   finder f) {
  if (level < min_level() || level > max_level())
    return make_error(errc::invalid_argument, "zstd level " + std::to_string(level)
                                                + " is outside [" + std::to_string(min_level())
                                                + ", " + std::to_string(max_level()) + "]");
  auto s = std::make_unique<state>();
  if (!s->cctx)
    return make_error(errc::limit_exceeded, "out of memory creating a zstd context");
  configure(s->cctx.get(), level, workers, f);
  if (ZSTD_CCtx_setPledgedSrcSize(s->cctx.get(), total_size) != 0)
    return make_error(errc::invalid_argument,
                      "zstd refused a frame of " + std::to_string(total_size) + " bytes");
  s->total = total_size;
  return stream_compressor{std::move(s)};
}

namespace {

/// Runs the compressor on `in` with `mode` through `room`, appending what it
/// writes to `out`.
status pump(ZSTD_CCtx* cctx, std::span<const std::byte> in, ZSTD_EndDirective mode,
            std::span<std::byte> room, std::vector<std::byte>& out) {
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  for (;;) {
    ZSTD_outBuffer dst{room.data(), room.size(), 0};
    size_t left = ZSTD_compressStream2(cctx, &dst, &src, mode);
    out.insert(out.end(), room.begin(), room.begin() + static_cast<ptrdiff_t>(dst.pos));
    if (ZSTD_isError(left))
      return make_error(errc::invalid_argument,
                        std::string{"zstd compression failed: "} + ZSTD_getErrorName(left));
    const bool drained = src.pos == src.size;
    if (mode == ZSTD_e_continue ? drained : left == 0)
      return {};
  }
}

} // namespace

status stream_compressor::restart(uint64_t total_size) {
  ZSTD_CCtx_reset(s_->cctx.get(), ZSTD_reset_session_only);
  if (ZSTD_CCtx_setPledgedSrcSize(s_->cctx.get(), total_size) != 0)
    return make_error(errc::invalid_argument,
                      "zstd refused a frame of " + std::to_string(total_size) + " bytes");
  s_->total = total_size;
  s_->seen = 0;
  return {};
}

status stream_compressor::update(std::span<const std::byte> in, std::vector<std::byte>& out) {
  if (in.size() > s_->total - s_->seen)
    return make_error(errc::invalid_argument,
                      "more bytes than the frame's pledged " + std::to_string(s_->total));
  s_->seen += in.size();
  return pump(s_->cctx.get(), in, ZSTD_e_continue, s_->room, out);
}

status stream_compressor::finish(std::vector<std::byte>& out) {
  if (s_->seen != s_->total)
    return make_error(errc::invalid_argument, "the frame got " + std::to_string(s_->seen)
                                                + " of its " + std::to_string(s_->total)
                                                + " bytes");
  return pump(s_->cctx.get(), {}, ZSTD_e_end, s_->room, out);
}

struct stream_decompressor::state {
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx{ZSTD_createDCtx(), &ZSTD_freeDCtx};
  compressed_input input;
  std::vector<std::byte> buffer;
  ZSTD_inBuffer in{nullptr, 0, 0};
  bool input_ended = false;
  bool frame_ended = false;
  uint64_t expected = 0;
  uint64_t produced = 0;

  status refill() {
    if (in.pos < in.size || input_ended)
      return {};
    auto n = input(buffer);
    if (!n)
      return std::move(n).error();
    if (*n == 0)
      input_ended = true;
    in = {buffer.data(), *n, 0};
    return {};
  }
};

stream_decompressor::stream_decompressor(std::unique_ptr<state> s) : s_(std::move(s)) {}
stream_decompressor::stream_decompressor(stream_decompressor&&) noexcept = default;
stream_decompressor& stream_decompressor::operator=(stream_decompressor&&) noexcept = default;
stream_decompressor::~stream_decompressor() = default;

result<stream_decompressor>
stream_decompressor::start(uint64_t expected_size, compressed_input input, size_t input_buffer) {
  auto s = std::make_unique<state>();
  if (!s->dctx)
    return make_error(errc::limit_exceeded, "out of memory creating a zstd context");
  ZSTD_DCtx_setParameter(s->dctx.get(), ZSTD_d_windowLogMax, max_window_log);
  s->input = std::move(input);
  s->buffer.resize(input_buffer != 0 ? input_buffer : ZSTD_DStreamInSize());
  s->expected = expected_size;
  return stream_decompressor{std::move(s)};
}

status stream_decompressor::read(std::span<std::byte> out) {
  auto& s = *s_;
  if (out.size() > s.expected - s.produced)
    return decode_error("asked for " + std::to_string(out.size()) + " bytes past the expected "
                        + std::to_string(s.expected));
  auto got = read_some(out);
  if (!got)
    return std::move(got).error();
  if (*got < out.size())
    return decode_error("zstd data holds " + std::to_string(s.produced)
                        + " bytes, fewer than the expected " + std::to_string(s.expected));
  return {};
}

result<size_t> stream_decompressor::read_some(std::span<std::byte> out) {
  auto& s = *s_;
  out = out.first(static_cast<size_t>(std::min<uint64_t>(out.size(), s.expected - s.produced)));
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  while (dst.pos < dst.size) {
    if (auto ok = s.refill(); !ok)
      return std::move(ok).error();
    if (s.in.pos == s.in.size && s.input_ended) {
      if (!s.frame_ended)
        return decode_error("zstd data is truncated after " + std::to_string(s.produced + dst.pos)
                            + " bytes");
      break;
    }
    // A finished frame followed by more input: the next frame begins.
    size_t left = ZSTD_decompressStream(s.dctx.get(), &dst, &s.in);
    if (ZSTD_isError(left))
      return decode_error(std::string{"zstd data is corrupt: "} + ZSTD_getErrorName(left));
    s.frame_ended = left == 0;
  }
  s.produced += dst.pos;
  return dst.pos;
}

status stream_decompressor::finish() {
  auto& s = *s_;
  if (s.produced != s.expected)
    return decode_error("zstd data was read to " + std::to_string(s.produced) + " of "
                        + std::to_string(s.expected) + " bytes");
  // The frame's epilogue (its checksum) may still be unread.
  std::byte extra[1];
  while (!s.frame_ended) {
    if (auto ok = s.refill(); !ok)
      return ok;
    if (s.in.pos == s.in.size && s.input_ended)
      return decode_error("zstd data is truncated at its end");
    ZSTD_outBuffer dst{extra, sizeof extra, 0};
    size_t left = ZSTD_decompressStream(s.dctx.get(), &dst, &s.in);
    if (ZSTD_isError(left))
      return decode_error(std::string{"zstd data is corrupt: "} + ZSTD_getErrorName(left));
    if (dst.pos != 0)
      return decode_error("zstd data holds more than the expected " + std::to_string(s.expected)
                          + " bytes");
    if (left == 0)
      s.frame_ended = true;
  }
  if (auto ok = s.refill(); !ok)
    return ok;
  if (s.in.pos != s.in.size || !s.input_ended)
    return decode_error("bytes follow the zstd frame");
  return {};
}

namespace {

/// Writes `v` as unsigned LEB128 at `out`; answers the bytes written (<= 10).
size_t put_varint(uint64_t v, std::byte* out) noexcept {
  size_t k = 0;
  while (v >= 0x80) {
    out[k++] = static_cast<std::byte>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out[k++] = static_cast<std::byte>(v);
  return k;
}

/// Reads an unsigned LEB128 from [at, end); answers the bytes it took, 0
/// when it runs past `end`, and -1 when it is longer than 10 bytes or
/// overflows 64 bits.
int get_varint(const std::byte* at, const std::byte* end, uint64_t& v) noexcept {
  v = 0;
  for (int k = 0; k < 10; ++k) {
    if (at + k >= end)
      return 0;
    const auto b = static_cast<uint64_t>(at[k]);
    if (k == 9 && b > 1)
      return -1;
    v |= (b & 0x7f) << (7 * k);
    if ((b & 0x80) == 0)
      return k + 1;
  }
  return -1;
}

constexpr size_t max_run_header = 20;

/// XORs `k` literal bytes into `base`, and copies them to `dense` unless
/// it is null.
void xor_literal(std::byte* base, std::byte* dense, const std::byte* lit, size_t k) noexcept {
  if (k <= 16) {
    for (size_t j = 0; j < k; ++j)
      base[j] ^= lit[j];
  } else {
    xor_bytes(base, base, lit, k);
  }
  if (dense)
    std::memcpy(dense, lit, k);
}

} // namespace

size_t sparse_encode_bound(size_t n) noexcept {
  // Every run but the last covers at least sparse_min_gap zeros and one
  // literal byte, and costs at most two 10-byte varints besides its literals.
  return n + max_run_header * (n / (sparse_min_gap + 1) + 2);
}

namespace {

/// Bit i: byte `at + i` of `s` is zero. Bytes at or past `n` count as zero.
uint64_t zero_bits(const unsigned char* s, size_t at, size_t n) noexcept {
  if (at + 64 <= n) {
#if defined(__SSE2__)
    const __m128i zeros = _mm_setzero_si128();
    uint64_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      const auto v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + at + 16 * k));
      bits |=
        static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zeros))))
        << (16 * k);
    }
    return bits;
#else
    uint64_t bits = 0;
    for (size_t k = 0; k < 64; ++k)
      bits |= static_cast<uint64_t>(s[at + k] == 0) << k;
    return bits;
#endif
  }
  uint64_t bits = ~uint64_t{0};
  for (size_t k = 0; at + k < n; ++k)
    if (s[at + k] != 0)
      bits &= ~(uint64_t{1} << k);
  return bits;
}

/// Appends one run: `gap`, the literal's length, the literal.
std::byte* put_run(std::byte* w, uint64_t gap, const unsigned char* literal, size_t length) {
  w += put_varint(gap, w);
  w += put_varint(length, w);
  std::memcpy(w, literal, length);
  return w + length;
}

} // namespace

size_t sparse_encode(std::span<const std::byte> xored, std::span<std::byte> out) noexcept {
  static_assert(sparse_min_gap >= 1 && sparse_min_gap < 64);
  constexpr unsigned g = sparse_min_gap;
  const auto* s = reinterpret_cast<const unsigned char*>(xored.data());
  const size_t n = xored.size();
  std::byte* w = out.data();
  if (n == 0)
    return 0;
  // 64 bytes a step, as bit masks. Z: the byte is zero (bytes outside the
  // piece count as zero, so zeros at either end are always a gap). W: the
  // byte starts g zeros. L: the byte lies in a stretch of g zeros or more,
  // that is in a gap; the runs' literals are the stretches outside L.
  const size_t words = (n + 63) / 64;
  uint64_t z = zero_bits(s, 0, n);
  // W of the 64 (zero) bytes before the piece.
  uint64_t w_before = ~uint64_t{0};
  for (unsigned j = 1; j < g; ++j)
    w_before &= (~uint64_t{0} >> j) | (z << (64 - j));
  uint64_t l_top = 1; // L of the byte before the piece
  bool in_gap = true;
  size_t gap_start = 0;
  size_t literal_start = 0;
  for (size_t k = 0; k < words; ++k) {
    const uint64_t z_next = k + 1 < words ? zero_bits(s, 64 * (k + 1), n) : ~uint64_t{0};
    uint64_t wz = z;
    for (unsigned j = 1; j < g; ++j)
      wz &= (z >> j) | (z_next << (64 - j));
    uint64_t l = wz;
    for (unsigned j = 1; j < g; ++j)
      l |= (wz << j) | (w_before >> (64 - j));
    // Where L changes: a literal starts (1 -> 0) or ends (0 -> 1).
    uint64_t changes = l ^ ((l << 1) | l_top);
    while (changes != 0) {
      const size_t at = 64 * k + static_cast<size_t>(__builtin_ctzll(changes));
      if (at >= n)
        break;
      changes &= changes - 1;
      if (in_gap) {
        literal_start = at;
      } else {
        w = put_run(w, literal_start - gap_start, s + literal_start, at - literal_start);
        gap_start = at;
      }
      in_gap = !in_gap;
    }
    l_top = l >> 63;
    w_before = wz;
    z = z_next;
  }
  if (!in_gap)
    w = put_run(w, literal_start - gap_start, s + literal_start, n - literal_start);
  else
    w = put_run(w, n - gap_start, s, 0);
  return static_cast<size_t>(w - out.data());
}

size_t sparse_encode_zeros(uint64_t count, std::span<std::byte, 11> out) noexcept {
  if (count == 0)
    return 0;
  size_t k = put_varint(count, out.data());
  return k + put_varint(0, out.data() + k);
}

sparse_applier::sparse_applier(uint64_t total_size, compressed_input runs, size_t buffer_bytes)
    : total_(total_size), input_(std::move(runs)),
      buffer_(std::max<size_t>(buffer_bytes, 4 * max_run_header)) {}

status sparse_applier::refill(size_t want) {
  if (tail_ - head_ >= want || input_ended_)
    return {};
  if (head_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + head_, tail_ - head_);
    tail_ -= head_;
    head_ = 0;
  }
  while (tail_ - head_ < want && tail_ < buffer_.size()) {
    auto got = input_(std::span{buffer_}.subspan(tail_));
    if (!got)
      return std::move(got).error();
    if (*got == 0) {
      input_ended_ = true;
      break;
    }
    tail_ += *got;
  }
  return {};
}

status sparse_applier::apply(std::span<std::byte> base, std::span<std::byte> dense) {
  const size_t n = base.size();
  if (n > total_ - pos_)
    return decode_error("asked for " + std::to_string(n) + " bytes past the tensor's "
                        + std::to_string(total_));
  if (!dense.empty())
    std::memset(dense.data(), 0, n);
  size_t at = 0;
  while (at < n) {
    if (gap_left_ == 0 && literal_left_ == 0) {
      // Whole runs that lie in the buffer and end within this piece, in one
      // tight loop: most runs of a sparse delta are a few bytes. Anything
      // else (a run crossing the piece's end or the buffer's, a bad run) is
      // left to the general steps below, which also report errors.
      const std::byte* p = buffer_.data() + head_;
      const std::byte* const end = buffer_.data() + tail_;
      const std::byte* const room_end = buffer_.data() + buffer_.size();
      while (end - p >= static_cast<ptrdiff_t>(max_run_header)) {
        uint64_t gap = 0, length = 0;
        int a = 1, b = 1;
        if (static_cast<unsigned char>(p[0]) < 0x80)
          gap = static_cast<unsigned char>(p[0]);
        else
          a = get_varint(p, end, gap);
        if (a <= 0)
          break;
        if (static_cast<unsigned char>(p[a]) < 0x80)
          length = static_cast<unsigned char>(p[a]);
        else
          b = get_varint(p + a, end, length);
        if (b <= 0 || (gap == 0 && length == 0) || gap > n - at || length > n - at - gap
            || length > static_cast<uint64_t>(end - p - a - b))
          break;
        p += a + b;
        at += static_cast<size_t>(gap);
        const size_t k = static_cast<size_t>(length);
#if defined(__SSE2__)
        if (k <= 16 && n - at >= 16 && room_end - p >= 16) {
          // Sixteen bytes at once, the literal's masked in: no loop whose
          // length the branch predictor would have to guess.
          alignas(16) static constexpr unsigned char ones_then_zeros[32] = {
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xff, 0xff, 0,    0,    0,    0,    0,    0};
          const auto mask =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(ones_then_zeros + 16 - k));
          const auto lit =
            _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), mask);
          auto* into = reinterpret_cast<__m128i*>(base.data() + at);
          _mm_storeu_si128(into, _mm_xor_si128(_mm_loadu_si128(into), lit));
          if (!dense.empty())
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dense.data() + at), lit);
        } else
#endif
        {
          xor_literal(base.data() + at, dense.empty() ? nullptr : dense.data() + at, p, k);
        }
        at += k;
        p += k;
      }
      head_ = static_cast<size_t>(p - buffer_.data());
      if (at == n)
        break;
    }
    if (gap_left_ > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(gap_left_, n - at));
      at += k;
      gap_left_ -= k;
      continue;
    }
    if (literal_left_ > 0) {
      if (head_ == tail_) {
        if (auto ok = refill(buffer_.size()); !ok)
          return ok;
        if (head_ == tail_)
          return decode_error("the run list ends inside a run, at byte " + std::to_string(pos_ + at)
                              + " of " + std::to_string(total_));
      }
      const size_t k =
        static_cast<size_t>(std::min<uint64_t>({literal_left_, tail_ - head_, n - at}));
      xor_literal(base.data() + at, dense.empty() ? nullptr : dense.data() + at,
                  buffer_.data() + head_, k);
      at += k;
      head_ += k;
      literal_left_ -= k;
      continue;
    }
    if (tail_ - head_ < max_run_header)
      if (auto ok = refill(max_run_header); !ok)
        return ok;
    const std::byte* p = buffer_.data() + head_;
    const std::byte* end = buffer_.data() + tail_;
    uint64_t gap = 0, length = 0;
    const int a = get_varint(p, end, gap);
    const int b = a > 0 ? get_varint(p + a, end, length) : a;
    if (a < 0 || b < 0)
      return decode_error("a run's length is not a valid varint, at byte "
                          + std::to_string(pos_ + at));
    if (a == 0 || b == 0)
      return decode_error(head_ == tail_ ? "the run list ends at byte " + std::to_string(pos_ + at)
                                             + " of " + std::to_string(total_)
                                         : std::string{"the run list is truncated inside a run"});
    const uint64_t here = pos_ + at;
    if (gap == 0 && length == 0)
      return decode_error("a run covers no bytes, at byte " + std::to_string(here));
    if (gap > total_ - here || length > total_ - here - gap)
      return decode_error("a run at byte " + std::to_string(here) + " covers " + std::to_string(gap)
                          + " + " + std::to_string(length) + " bytes, past the tensor's "
                          + std::to_string(total_));
    head_ += static_cast<size_t>(a + b);
    gap_left_ = gap;
    literal_left_ = length;
  }
  pos_ += n;
  return {};
}

status sparse_applier::finish() {
  if (pos_ != total_ || gap_left_ != 0 || literal_left_ != 0)
    return decode_error("the run list was applied to " + std::to_string(pos_) + " of "
                        + std::to_string(total_) + " bytes");
  if (auto ok = refill(1); !ok)
    return ok;
  if (head_ != tail_)
    return decode_error("bytes follow the run list's last run");
  return {};
}

} // namespace stitch::delta
