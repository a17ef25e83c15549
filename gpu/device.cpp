#include "gpu/device.hpp"

#include <string>

#include "gpu/cuda_backend.hpp"
#include "gpu/device_memory.hpp"

namespace stitch::gpu {

bool cuda_compiled() noexcept {
#ifdef STITCH_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int device_count() noexcept {
  return cuda::device_count();
}

std::string why_no_device() {
  if (!cuda_compiled())
    return "this build of Stitch has no CUDA (no nvcc)";
  if (device_count() == 0)
    return "no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)";
  return {};
}

status require_device(int device) {
  if (auto why = why_no_device(); !why.empty())
    return make_error(errc::engine_unavailable, why);
  if (device < 0 || device >= device_count())
    return make_error(errc::engine_unavailable, "CUDA device " + std::to_string(device)
                                                  + " does not exist (this machine has "
                                                  + std::to_string(device_count()) + ")");
  return {};
}

status device_xor_apply(std::span<std::byte> base, std::span<const std::byte> delta) {
  if (base.size() != delta.size())
    return make_error(errc::decode_failure, "xor delta has " + std::to_string(delta.size())
                                              + " bytes but the tensor has "
                                              + std::to_string(base.size()));
  if (auto ok = require_device(0); !ok)
    return ok;
  auto stream = device_stream::create(0);
  if (!stream)
    return std::move(stream).error();
  auto dev_base = device_buffer::allocate(0, base.size());
  if (!dev_base)
    return std::move(dev_base).error();
  auto dev_delta = device_buffer::allocate(0, delta.size());
  if (!dev_delta)
    return std::move(dev_delta).error();
  if (auto ok = copy_to_device(*dev_base, 0, base, *stream); !ok)
    return ok;
  if (auto ok = copy_to_device(*dev_delta, 0, delta, *stream); !ok)
    return ok;
  if (auto ok = xor_on_device(*dev_base, 0, *dev_delta, 0, base.size(), *stream); !ok)
    return ok;
  if (auto ok = copy_to_host(base, *dev_base, 0, *stream); !ok)
    return ok;
  return stream->synchronize();
}

} // namespace stitch::gpu
