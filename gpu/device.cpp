#include "gpu/device.hpp"

#include <string>

namespace stitch::gpu {

#ifdef STITCH_HAVE_CUDA

namespace detail {
// Defined in gpu/xor_kernel.cu.
int cuda_device_count() noexcept;
const char* cuda_xor_launch(void* dev_base, const void* dev_delta, size_t n, void* stream) noexcept;
const char* cuda_xor_roundtrip(void* host_base, const void* host_delta, size_t n) noexcept;
} // namespace detail

bool cuda_compiled() noexcept {
  return true;
}

int device_count() noexcept {
  return detail::cuda_device_count();
}

status cuda_xor_apply(void* dev_base, const void* dev_delta, size_t n, void* stream) {
  if (const char* err = detail::cuda_xor_launch(dev_base, dev_delta, n, stream))
    return make_error(errc::decode_failure, std::string{"CUDA xor kernel failed: "} + err);
  return {};
}

status device_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta) {
  if (base.size() != delta.size())
    return make_error(errc::decode_failure, "xor delta has " + std::to_string(delta.size())
                                              + " bytes but the tensor has "
                                              + std::to_string(base.size()));
  if (device_count() == 0)
    return make_error(errc::engine_unavailable, "no CUDA device");
  if (const char* err = detail::cuda_xor_roundtrip(base.data(), delta.data(), base.size()))
    return make_error(errc::decode_failure, std::string{"CUDA xor failed: "} + err);
  return {};
}

#else

bool cuda_compiled() noexcept {
  return false;
}

int device_count() noexcept {
  return 0;
}

status cuda_xor_apply(void*, const void*, size_t, void*) {
  return make_error(errc::engine_unavailable, "built without CUDA");
}

status device_xor_apply(std::span<std::byte>, std::span<const std::byte>) {
  return make_error(errc::engine_unavailable, "built without CUDA");
}

#endif

} // namespace stitch::gpu
