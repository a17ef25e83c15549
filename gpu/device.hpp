#pragma once

#include <cstddef>
#include <span>

#include "runtime/core/error.hpp"

/// CUDA devices, behind an interface free of CUDA headers: callers compile
/// and run the same whether the build had nvcc and the machine has a GPU.
namespace stitch::gpu {

/// True when this build compiled the CUDA kernels (nvcc was found).
bool cuda_compiled() noexcept;

/// Number of usable CUDA devices; 0 without CUDA, without a driver or GPU.
int device_count() noexcept;

/// `dev_base ^= dev_delta` over `n` bytes of device memory, enqueued on
/// `stream` (a `cudaStream_t`; nullptr is the default stream). Asynchronous:
/// launch errors are reported, kernel faults surface at the next sync.
/// `engine_unavailable` without CUDA.
status cuda_xor_apply(void* dev_base, const void* dev_delta, size_t n, void* stream);

/// `base ^= delta` computed on device 0 through device buffers, synchronously
/// (copies in, `cuda_xor_apply`, copies out). Sizes must match
/// (`decode_failure`); `engine_unavailable` when no device is usable.
status device_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta);

} // namespace stitch::gpu
