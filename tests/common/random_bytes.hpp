#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace stitch::testing {

/// `n` pseudo-random bytes, the same for the same seed.
inline std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t word = rng();
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, n - i));
  }
  return out;
}

} // namespace stitch::testing
