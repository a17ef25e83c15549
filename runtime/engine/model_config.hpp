#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/core/error.hpp"

namespace stitch::engine {

/// How the weights are stored (`torch_dtype` in config.json).
enum class weight_dtype : uint8_t { float32, bfloat16 };

/// "float32" or "bfloat16".
std::string_view to_string(weight_dtype type) noexcept;

/// Which decoder the checkpoint is (`model_type` in config.json):
/// `llama` (dense SwiGLU MLPs) or `qwen3_moe` (Hugging Face's
/// Qwen3MoeForCausalLM: per-head RMSNorm of queries and keys before rotary,
/// and in every layer a sparse mixture of SwiGLU experts behind a linear
/// router, `mlp.gate`, that picks the top `num_experts_per_tok` experts of
/// each token by softmax score).
enum class architecture : uint8_t { llama, qwen3_moe };

/// "llama" or "qwen3_moe".
std::string_view to_string(architecture arch) noexcept;

/// The Hugging Face `config.json` of a Llama-architecture decoder (or its
/// Qwen3-MoE variant), the fields the built-in engine uses. `lm_head.weight`
/// is always a tensor of its own.
struct model_config {
  architecture arch = architecture::llama;
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;
  uint32_t vocab_size = 0;
  uint32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  weight_dtype torch_dtype = weight_dtype::float32;
  bool tie_word_embeddings = false;
  /// qwen3_moe only (0 for llama): experts per layer, experts each token is
  /// routed to, and each expert's intermediate width; with `norm_topk_prob`
  /// the chosen experts' softmax scores are renormalized to sum to 1.
  uint32_t num_experts = 0;
  uint32_t num_experts_per_tok = 0;
  uint32_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;

  bool is_moe() const noexcept { return arch == architecture::qwen3_moe; }
  uint32_t head_dim() const noexcept {
    return num_attention_heads == 0 ? 0 : hidden_size / num_attention_heads;
  }
  uint32_t kv_width() const noexcept { return num_key_value_heads * head_dim(); }
  /// Number of weight elements of the whole model.
  uint64_t parameter_count() const noexcept;

  friend bool operator==(const model_config&, const model_config&) = default;
};

/// Largest model the engine agrees to allocate (elements), so a hostile
/// config cannot make it reserve terabytes: 8 Gi parameters (32 GiB as fp32).
inline constexpr uint64_t max_parameter_count = uint64_t{8} << 30;

/// Checks every field; the error names the first offending one.
status validate(const model_config& config);

/// Parses and validates a config.json document. Unknown keys are ignored;
/// `model_type`, when present, must be "llama" (the default) or
/// "qwen3_moe", and `hidden_act` "silu". A qwen3_moe config must say
/// `num_experts`, `num_experts_per_tok` and `moe_intermediate_size`, and may
/// not use what the engine does not implement (dense `mlp_only_layers`, a
/// `decoder_sparse_step` other than 1, a `head_dim` other than
/// hidden_size / num_attention_heads, attention biases).
result<model_config> parse_model_config(std::string_view json_text);

/// A config.json for `config` that Hugging Face transformers loads as a
/// `LlamaForCausalLM` or `Qwen3MoeForCausalLM` (with bos 256 / eos 257 of the
/// byte tokenizer).
std::string render_model_config(const model_config& config);

/// Named model sizes: "tiny" (~0.4 MB fp32), "small" (~46 MB fp32) and
/// "medium" (~0.9 GB bf16), and the mixtures of experts "moe-tiny" (8
/// experts, top 2, ~0.5 MB fp32) and "moe-small" (16 experts, top 2, ~70 MB
/// fp32). All use the 258-token byte vocabulary.
result<model_config> preset(std::string_view name);

} // namespace stitch::engine
