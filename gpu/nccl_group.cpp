// Without CUDA: gpu/nccl_group.cu is not compiled, and the group says why.
#include "gpu/nccl_group.hpp"

#ifndef STITCH_HAVE_CUDA

namespace stitch::gpu {

struct nccl_group::impl {
  std::vector<int> devices;
};

nccl_group::nccl_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
nccl_group::~nccl_group() = default;

const std::vector<int>& nccl_group::devices() const noexcept {
  return impl_->devices;
}

result<std::unique_ptr<nccl_group>> nccl_group::create(std::vector<int>) {
  return make_error(errc::engine_unavailable, "NCCL needs a build with CUDA; this one has none");
}

status nccl_group::broadcast(size_t, const device_buffer&, std::span<const device_buffer* const>) {
  return make_error(errc::engine_unavailable, "NCCL needs a build with CUDA; this one has none");
}

} // namespace stitch::gpu
#endif
