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

  /// Mixtures of experts (qwen3_moe): the experts each processed position
  /// was routed to, position-major `[position][layer][num_experts_per_tok]`,
  /// each position's experts in descending router score (lowest id first
  /// on ties). Its layout is SGLang's `routed_experts` (see api_shapes.hpp).
  std::vector<int32_t> routed_experts;
  /// Routing replay: when not empty, the experts to use at each position, in
  /// the layout of `routed_experts` (what a rollout returned), instead of
  /// the router's own top-k; the mixing weights are still the router's own
  /// scores of those experts. It must cover every position stepped.
  std::vector<int32_t> replay_experts;
  /// Under replay, how many (position, layer) choices of the router's own
  /// top-k differ (as a set) from the replayed experts.
  uint64_t replay_disagreements = 0;
};

/// What the last layer's mixture of experts did for one sequence in one
/// step: what a trainer needs for the router's gradient.
struct moe_trace {
  /// The normalized hidden state the router and the experts read.
  std::vector<float> input;
  /// The router's logits, `num_experts` floats.
  std::vector<float> router_logits;
  /// The experts used (`num_experts_per_tok`), as in `routed_experts`.
  std::vector<int32_t> experts;
  /// Their outputs before mixing: `num_experts_per_tok x hidden_size`.
  std::vector<float> expert_outputs;
  /// The hidden state after the last layer, before the final norm.
  std::vector<float> residual;
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
/// normalized hidden state (`hidden_size` floats): the input of `lm_head`;
/// with `last_moe` (a mixture-of-experts model), each sequence's trace of the
/// last layer's mixture. A replay that does not cover the position, or names
/// an expert outside the layer or twice, is an error.
result<step_logits> step(const weights& w, std::span<sequence* const> batch,
                         std::span<const int32_t> next_tokens, parallel_for& pool,
                         step_logits* hidden = nullptr, std::vector<moe_trace>* last_moe = nullptr);

/// The `k` largest of `scores` (`n` floats), in descending order, the lowest
/// index first among equal scores; `out` receives `k` indices.
void top_k(const float* scores, size_t n, size_t k, int32_t* out) noexcept;

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
