#include "runtime/core/delta_codec.hpp"

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include <zstd.h>
#include <zstd_errors.h>

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

result<std::vector<std::byte>> compress(std::span<const std::byte> bytes, int level) {
  if (level < min_level() || level > max_level())
    return make_error(errc::invalid_argument, "zstd level " + std::to_string(level)
                                                + " is outside [" + std::to_string(min_level())
                                                + ", " + std::to_string(max_level()) + "]");
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx{ZSTD_createCCtx(), &ZSTD_freeCCtx};
  if (!cctx)
    return make_error(errc::limit_exceeded, "out of memory creating a zstd context");
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  // The frame checksum turns corruption into an error instead of wrong bytes.
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
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

} // namespace stitch::delta
