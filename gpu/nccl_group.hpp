#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "gpu/device_memory.hpp"
#include "runtime/core/error.hpp"

namespace stitch::gpu {

/// NCCL inside a node: one communicator per listed GPU of this process
/// (`ncclCommInitAll`), so a version one replica fetched over the network is
/// broadcast from its GPU to the others over NVLink/PCIe instead of being
/// fetched again. With one GPU the group has one rank and a broadcast is a
/// copy on that device: the same calls run. NCCL is loaded at run time
/// (`libnccl.so.2`, or the path in `STITCH_NCCL`); without it, or without
/// CUDA, `create` says why.
class nccl_group {
public:
  /// A group over distinct CUDA devices.
  static result<std::unique_ptr<nccl_group>> create(std::vector<int> devices);
  ~nccl_group();
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  const std::vector<int>& devices() const noexcept;

  /// Copies `src` (on `devices()[root]`) into each of `dst` (one per other
  /// rank, in rank order, skipping the root; with one rank, one buffer on
  /// the root's device): one NCCL broadcast, waited for. Sizes must match.
  status broadcast(size_t root, const device_buffer& src,
                   std::span<const device_buffer* const> dst);

  struct impl;

private:
  explicit nccl_group(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace stitch::gpu
