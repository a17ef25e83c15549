#include "gpu/checksum.hpp"

#include <algorithm>
#include <cstring>

#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"

namespace stitch::gpu {

namespace {

/// Large enough to amortize a task, small enough to balance the threads.
constexpr size_t xor_block = size_t{4} << 20;
/// A copy's blocks: a ring chunk (8 MiB) over 16 threads.
constexpr size_t copy_block = size_t{512} << 10;

} // namespace

uint64_t parallel_tree_checksum(std::span<const std::byte> bytes) {
  if (bytes.size() < parallel_threshold)
    return checksum::tree_checksum(bytes);
  return parallel_tree_checksum(bytes, shared_pool());
}

uint64_t parallel_tree_checksum(std::span<const std::byte> bytes, thread_pool& pool) {
  if (bytes.size() < parallel_threshold)
    return checksum::tree_checksum(bytes);
  return checksum::tree_checksum(bytes, pool);
}

status parallel_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta) {
  if (base.size() < parallel_threshold)
    return delta::xor_apply(base, delta);
  return parallel_xor_apply(base, delta, shared_pool());
}

status parallel_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta,
                          thread_pool& pool) {
  if (base.size() != delta.size() || base.size() < parallel_threshold)
    return delta::xor_apply(base, delta);
  size_t blocks = (base.size() + xor_block - 1) / xor_block;
  pool.run(blocks, [&](size_t i) {
    size_t offset = i * xor_block;
    size_t len = std::min(xor_block, base.size() - offset);
    // Sizes are equal, so the per-block apply cannot fail.
    (void) delta::xor_apply(base.subspan(offset, len), delta.subspan(offset, len));
  });
  return {};
}

void parallel_copy(std::span<std::byte> dst, std::span<const std::byte> src) {
  const size_t n = std::min(dst.size(), src.size());
  if (n < parallel_copy_threshold) {
    if (n > 0)
      std::memcpy(dst.data(), src.data(), n);
    return;
  }
  shared_pool().run((n + copy_block - 1) / copy_block, [&](size_t i) {
    const size_t at = i * copy_block;
    std::memcpy(dst.data() + at, src.data() + at, std::min(copy_block, n - at));
  });
}

} // namespace stitch::gpu
