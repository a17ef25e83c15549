#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/host_buffer.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/pipeline/host_tensors.hpp"

namespace stitch::engine {

struct device_weights;

/// One tensor of a model in host memory (from the staging allocator, so the
/// transport and the GPU can register it in place). Immutable once built and
/// shared between the versions that did not change it.
struct tensor_buffer {
  std::string name;
  safetensors::dtype type = safetensors::dtype::u8;
  std::vector<uint64_t> shape;
  gpu::host_buffer bytes;
};

/// A model's tensors by name.
using tensor_map = std::map<std::string, std::shared_ptr<const tensor_buffer>>;

/// A fresh (uninitialized) tensor buffer of `type` and `shape`.
result<std::shared_ptr<tensor_buffer>> make_tensor_buffer(std::string name, safetensors::dtype type,
                                                          std::vector<uint64_t> shape);

/// Copies tensors held in memory into tensor buffers.
result<tensor_map> to_tensor_map(const pipeline::tensor_set& tensors);

/// A row-major fp32 matrix, `rows` x `cols` (Hugging Face `[out, in]`),
/// viewing memory the `weights` own.
struct matrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::span<const float> data;

  const float* row(uint32_t r) const noexcept { return data.data() + size_t{r} * cols; }
};

/// One expert of a mixture-of-experts layer: a SwiGLU MLP.
struct expert_weights {
  matrix gate_proj;
  matrix up_proj;
  matrix down_proj;
};

struct layer_weights {
  matrix q_proj;
  matrix k_proj;
  matrix v_proj;
  matrix o_proj;
  matrix gate_proj;
  matrix up_proj;
  matrix down_proj;
  std::span<const float> input_layernorm;
  std::span<const float> post_attention_layernorm;
  /// qwen3_moe: per-head RMSNorm of queries and keys (`head_dim` floats
  /// each), the router (`[num_experts, hidden]`) and the experts; the dense
  /// `gate_proj`/`up_proj`/`down_proj` above are then empty.
  std::span<const float> q_norm;
  std::span<const float> k_norm;
  matrix router;
  std::vector<expert_weights> experts;
};

/// A model's weights ready for the forward pass: views of fp32 tensors in
/// place (no copy), or of fp32 buffers widened once from bf16 checkpoints
/// (twice the memory of the checkpoint, but every kernel runs on one layout
/// and the hot loop has no conversion). Immutable once built and shared as
/// `std::shared_ptr<const weights>`, so activating a new version is a pointer
/// swap.
struct weights {
  model_config config;
  matrix embed_tokens;
  std::vector<layer_weights> layers;
  std::span<const float> norm;
  matrix lm_head;
  /// What the views point into.
  tensor_map tensors;
  std::vector<std::shared_ptr<const gpu::host_buffer>> widened;
  /// On an engine with a device (`engine.device = cuda`): the same tensors
  /// on the device, which its forward pass reads; the views above are then
  /// empty (the host keeps the tensors for peers, not for compute).
  std::shared_ptr<const device_weights> device;
};

/// The name and shape of one tensor a model needs.
struct tensor_spec {
  std::string name;
  std::vector<uint64_t> shape;
};

/// Every tensor of a `config` model, with its Hugging Face name and shape,
/// in a fixed order (embeddings, layers in order, final norm, lm_head).
std::vector<tensor_spec> expected_tensors(const model_config& config);

/// Checks checkpoint tensors against `config`: every expected tensor present
/// with the config's dtype and exactly its shape, and no other tensor; errors
/// name the tensor.
status check_tensors(const model_config& config, const tensor_map& tensors);

/// Weights that hold checked tensors without viewing them (no widening): a
/// device engine's host side, completed with `device` by its caller.
result<std::shared_ptr<weights>> bind_weights(const model_config& config, tensor_map tensors);

/// Builds the weights from checkpoint tensors, which they keep and view.
/// Every expected tensor must be present with the config's dtype and exactly
/// its shape, and no other tensor may be present; errors name the tensor.
result<std::shared_ptr<const weights>> build_weights(const model_config& config,
                                                     tensor_map tensors);
/// The same from tensors held in memory (copied into tensor buffers).
result<std::shared_ptr<const weights>> build_weights(const model_config& config,
                                                     const pipeline::tensor_set& tensors);

/// Deterministic random weights in the config's dtype: matrices are
/// approximately normal with standard deviation 0.02, norms are 1.0. Each
/// tensor's values depend only on `seed` and the tensor's name.
result<pipeline::tensor_set> random_init(const model_config& config, uint64_t seed);

} // namespace stitch::engine
