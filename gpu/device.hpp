#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "runtime/core/error.hpp"

/// CUDA devices, behind an interface free of CUDA headers: callers compile
/// and run the same whether the build had nvcc and the machine has a GPU.
namespace stitch::gpu {

/// True when this build compiled the CUDA kernels (nvcc was found).
bool cuda_compiled() noexcept;

/// Number of usable CUDA devices; 0 without CUDA, without a driver or GPU.
int device_count() noexcept;

/// Why no device is usable, for tests that skip and errors that refuse:
/// "this build of Stitch has no CUDA (no nvcc)", "no CUDA device is
/// visible ...", or empty when a device is there.
std::string why_no_device();

/// `device` when it is a usable CUDA device, else `engine_unavailable` with
/// the reason.
status require_device(int device);

/// `base ^= delta` computed on device 0 through device buffers, synchronously
/// (copies in, xor kernel, copies out). Sizes must match (`decode_failure`);
/// `engine_unavailable` when no device is usable.
status device_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta);

} // namespace stitch::gpu
