#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/store/host_tensors.hpp"

namespace stitch::engine {

/// A row-major fp32 matrix, `rows` x `cols` (Hugging Face `[out, in]`).
struct matrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<float> data;

  const float* row(uint32_t r) const noexcept { return data.data() + size_t{r} * cols; }
};

struct layer_weights {
  matrix q_proj;
  matrix k_proj;
  matrix v_proj;
  matrix o_proj;
  matrix gate_proj;
  matrix up_proj;
  matrix down_proj;
  std::vector<float> input_layernorm;
  std::vector<float> post_attention_layernorm;
};

/// A model's weights ready for the forward pass. bf16 checkpoints are widened
/// to fp32 once, when the weights are built (twice the memory of the
/// checkpoint, but every kernel runs on one layout and the hot loop has no
/// conversion). Immutable once built and shared as `std::shared_ptr<const
/// weights>`, so activating a new version is a pointer swap.
struct weights {
  model_config config;
  matrix embed_tokens;
  std::vector<layer_weights> layers;
  std::vector<float> norm;
  matrix lm_head;
};

/// The name and shape of one tensor a model needs.
struct tensor_spec {
  std::string name;
  std::vector<uint64_t> shape;
};

/// Every tensor of a `config` model, with its Hugging Face name and shape,
/// in a fixed order (embeddings, layers in order, final norm, lm_head).
std::vector<tensor_spec> expected_tensors(const model_config& config);

/// Builds the weights from checkpoint tensors. Every expected tensor must be
/// present with the config's dtype and exactly its shape, and no other
/// tensor may be present; errors name the tensor.
result<std::shared_ptr<const weights>> build_weights(const model_config& config,
                                                     const store::tensor_set& tensors);

/// Deterministic random weights in the config's dtype: matrices are
/// approximately normal with standard deviation 0.02, norms are 1.0. Each
/// tensor's values depend only on `seed` and the tensor's name.
result<store::tensor_set> random_init(const model_config& config, uint64_t seed);

} // namespace stitch::engine
