#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

/// The built-in engine's forward pass on a CUDA device: the Llama decoder of
/// `runtime/engine/model.hpp` (RMSNorm, rotary "rotate_half", grouped-query
/// attention, SwiGLU MLP, untied lm_head), one token of each sequence per
/// step. GEMMs run in cuBLAS (fp32 weights: SGEMM, no TF32; bf16 weights:
/// bf16 inputs with fp32 accumulation and output); norms, rotary, attention
/// and the element-wise steps are kernels of this folder. KV caches are fp32
/// on the device, one slot per sequence in flight, allocated up front.
///
/// The weights are device pointers (`device_buffer`s the caller keeps), so a
/// new version is served by handing `step` another `llama_tensors`: the
/// engine's activation swaps one pointer. No CUDA headers here; without CUDA
/// (or without a device) `create` says why not. cuBLAS is loaded at run time
/// (`libcublas.so.13`, `.12`, or the path in `STITCH_CUBLAS`), so a build
/// with CUDA still starts on a machine without it.
namespace stitch::gpu {

struct llama_shape {
  uint32_t hidden = 0;
  uint32_t intermediate = 0;
  uint32_t layers = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint32_t vocab = 0;
  uint32_t max_positions = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  /// Weights in bf16 (else fp32).
  bool bf16 = false;

  uint32_t head_dim() const noexcept { return heads == 0 ? 0 : hidden / heads; }
  uint32_t kv_width() const noexcept { return kv_heads * head_dim(); }
};

/// Shape checks (head_dim even, heads a multiple of kv_heads, ...): the error
/// names the field.
status validate(const llama_shape& shape);

/// Device pointers to one version's tensors, in the dtype of the shape.
struct llama_layer_tensors {
  const void* q_proj = nullptr;
  const void* k_proj = nullptr;
  const void* v_proj = nullptr;
  const void* o_proj = nullptr;
  const void* gate_proj = nullptr;
  const void* up_proj = nullptr;
  const void* down_proj = nullptr;
  const void* input_layernorm = nullptr;
  const void* post_attention_layernorm = nullptr;
};

struct llama_tensors {
  const void* embed_tokens = nullptr;
  std::vector<llama_layer_tensors> layers;
  const void* norm = nullptr;
  const void* lm_head = nullptr;
  /// The version's own settings (its config.json), which may differ from
  /// the shape's without changing any size.
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
};

/// One sequence's token in a step: its KV slot, the position the token is
/// at (the slot's cache holds positions below it) and the token.
struct llama_token {
  uint32_t slot = 0;
  uint32_t position = 0;
  int32_t token = 0;
};

class llama_runner {
public:
  /// Device memory `create` takes besides the weights: the KV caches of
  /// `slots` sequences of `max_positions` and one step's activations.
  static uint64_t workspace_bytes(const llama_shape& shape, uint32_t slots) noexcept;

  static result<std::unique_ptr<llama_runner>> create(int device, const llama_shape& shape,
                                                      uint32_t slots);
  ~llama_runner();
  llama_runner(const llama_runner&) = delete;
  llama_runner& operator=(const llama_runner&) = delete;

  const llama_shape& shape() const noexcept;
  uint32_t slots() const noexcept;
  int device() const noexcept;

  /// One token of each of `batch` (distinct slots); `logits` receives
  /// `batch.size() x vocab` floats, in batch order. The KV cache of each
  /// slot gains the token's position. Not thread-safe: one step at a time.
  status step(const llama_tensors& weights, std::span<const llama_token> batch,
              std::span<float> logits);

  struct impl;

private:
  explicit llama_runner(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace stitch::gpu
