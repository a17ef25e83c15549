#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch::engine {

/// The state of one sequence being generated: its KV cache and the position
/// of the next token. Owned by the caller; `step` advances it.
struct sequence {
  explicit sequence(const model_config& config);

  /// Tokens processed so far (the position of the next token).
  uint32_t position = 0;
  /// Per layer, the keys and values of every processed position,
  /// position-major: `[position][kv_heads * head_dim]`, rotary applied to keys.
  std::vector<std::vector<float>> keys;
  std::vector<std::vector<float>> values;
};

/// One logits vector (`vocab_size` floats) per sequence of a step.
using step_logits = std::vector<std::vector<float>>;

/// Runs one token of each sequence of `batch` through the model together:
/// `next_tokens[i]` is fed to `*batch[i]` at its current position, its KV
/// cache grows by one and its position advances. Returns the logits of the
/// next token for every sequence, in batch order.
///
/// Batch invariant: every output element is computed by the same code with
/// the same reduction order whatever the batch holds, so a sequence's logits
/// are bit-identical alone or batched. Work is spread over output rows (and
/// over sequence x head for attention) on `pool`, which never changes a
/// reduction. On error (a size mismatch, a token outside the vocabulary, a
/// sequence at `max_position_embeddings`, a sequence twice in the batch) no
/// sequence is touched. With `hidden`, it also receives each sequence's final
/// normalized hidden state (`hidden_size` floats): the input of `lm_head`.
result<step_logits> step(const weights& w, std::span<sequence* const> batch,
                         std::span<const int32_t> next_tokens, parallel_for& pool,
                         step_logits* hidden = nullptr);

/// `step` on the process-wide thread pool.
result<step_logits> step(const weights& w, std::span<sequence* const> batch,
                         std::span<const int32_t> next_tokens);

/// The dot product every kernel uses: 16 partial sums over contiguous
/// elements, a fixed pairwise reduction of the partials, then the tail.
float dot(const float* a, const float* b, size_t n) noexcept;

/// `y[b][r] = dot(w.row(r), x[b])` for `batch` input rows of `w.cols` floats.
/// Rows are split across `pool` in fixed chunks.
void matmul(const matrix& w, const float* x, size_t batch, float* y, parallel_for& pool);

/// HF Llama RMSNorm of `n` floats: `x / sqrt(mean(x^2) + eps) * weight`.
void rms_norm(const float* x, const float* weight, size_t n, double eps, float* out) noexcept;

/// HF Llama rotary embedding ("rotate_half") of one head of `head_dim`
/// floats at `position`, in place.
void apply_rope(float* head, uint32_t head_dim, uint32_t position, double theta) noexcept;

} // namespace stitch::engine
