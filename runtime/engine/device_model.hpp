#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "gpu/device_memory.hpp"
#include "gpu/llama.hpp"
#include "runtime/core/engine_kind.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/model_config.hpp"

/// The built-in engine's weights on a device (`engine.device = cuda`).
namespace stitch::engine {

/// One version's tensors on a device: the buffers by name (shared with the
/// versions that did not change them, so a delta stage allocates only what
/// it touches) and the pointer table `gpu::llama_runner::step` reads.
/// Immutable once built.
struct device_weights {
  std::map<std::string, std::shared_ptr<const gpu::device_buffer>> buffers;
  gpu::llama_tensors pointers;
};

/// The runner's shape for a dense Llama `config`; `invalid_argument` for what
/// the CUDA forward pass does not run (a mixture of experts).
result<gpu::llama_shape> llama_shape_of(const model_config& config);

/// Whether a version of `config` can be served by a runner built for
/// `built`: the same dimensions and dtype, at most its positions. rope_theta
/// and rms_norm_eps may differ (they are read per version). The error says
/// what differs.
status fits_runner(const gpu::llama_shape& built, const model_config& config);

/// The pointer table over `buffers` (every tensor of `config` present).
result<std::shared_ptr<const device_weights>>
bind_device_weights(const model_config& config,
                    std::map<std::string, std::shared_ptr<const gpu::device_buffer>> buffers);

/// The device memory a replica of `config` with `slots` sequences in flight
/// needs, decided before anything is allocated.
struct device_budget {
  /// The served weights, and a shadow as large (a full anchor staged while
  /// serving).
  uint64_t weights = 0;
  uint64_t shadow = 0;
  /// KV caches and one step's activations (`gpu::llama_runner`).
  uint64_t workspace = 0;
  /// The staging ring's device chunks.
  uint64_t staging = 0;
  uint64_t total() const noexcept { return weights + shadow + workspace + staging; }
};

device_budget device_budget_for(const model_config& config, uint32_t slots, uint64_t staging_bytes);

/// `limit_exceeded` naming each part when `budget` is more than `free` bytes
/// of `device_label` ("CUDA device 0 (NVIDIA H200)").
status check_budget(const device_budget& budget, uint64_t free, const std::string& device_label);

} // namespace stitch::engine
