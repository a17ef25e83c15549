#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "gpu/cpu_parallel.hpp"
#include "runtime/core/error.hpp"

namespace stitch::gpu {

/// Below this size the work stays on the calling thread: waking the pool
/// costs more than hashing or xoring a few MiB.
inline constexpr size_t parallel_threshold = size_t{8} << 20;

/// `checksum::tree_checksum` with the chunks spread over `pool` (the shared
/// pool by default) once `bytes` reaches `parallel_threshold`.
uint64_t parallel_tree_checksum(std::span<const std::byte> bytes);
uint64_t parallel_tree_checksum(std::span<const std::byte> bytes, thread_pool& pool);

/// `delta::xor_apply` split over the pool in blocks; same errors.
status parallel_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta);
status parallel_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta,
                          thread_pool& pool);

/// `memcpy` of `src` into `dst` (as large), split over the shared pool in
/// blocks from `parallel_copy_threshold` on: one thread copies from pageable
/// memory at a fraction of what the memory and the PCIe link take.
inline constexpr size_t parallel_copy_threshold = size_t{2} << 20;
void parallel_copy(std::span<std::byte> dst, std::span<const std::byte> src);

} // namespace stitch::gpu
