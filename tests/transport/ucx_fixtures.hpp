#pragma once

// Shared by the UCX tests: deterministic bytes, and length-prefixed frames
// a forked holder writes to its parent through a pipe.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace stitch::transport::ucx::testing {

/// `n` bytes that depend only on `seed`.
inline std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng{seed};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i)
    out[i] = static_cast<std::byte>(i * 7 + seed);
  return out;
}

/// Writes `bytes` as one frame (an 8-byte length, then the bytes).
inline void write_frame(int fd, const std::vector<std::byte>& bytes) {
  uint64_t n = bytes.size();
  (void) !::write(fd, &n, sizeof n);
  (void) !::write(fd, bytes.data(), bytes.size());
}

/// Reads one frame; empty when the pipe closed first.
inline std::vector<std::byte> read_frame(int fd) {
  uint64_t n = 0;
  if (::read(fd, &n, sizeof n) != static_cast<ssize_t>(sizeof n) || n > (uint64_t{1} << 20))
    return {};
  std::vector<std::byte> bytes(n);
  size_t got = 0;
  while (got < n) {
    auto r = ::read(fd, bytes.data() + got, n - got);
    if (r <= 0)
      return {};
    got += static_cast<size_t>(r);
  }
  return bytes;
}

} // namespace stitch::transport::ucx::testing
