#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/engine_port.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch::engine {

struct sampling_options {
  /// 0 = greedy (argmax, lowest id on ties).
  double temperature = 0.0;
  /// 0 = no top-k cut.
  uint32_t top_k = 0;
  /// Nucleus: the smallest set of most likely tokens whose probability
  /// reaches `top_p` of the (top-k) mass; 1 = no cut.
  double top_p = 1.0;
  uint64_t seed = 0;
  uint32_t max_tokens = 16;
  /// Generation stops at the first occurrence of any of these in the
  /// generated text; the text is cut before it.
  std::vector<std::string> stop;
  /// Generation stops when the model samples EOS (not part of the text).
  bool stop_at_eos = true;
};

/// Checks the ranges: temperature finite in [0, 100], top_p in (0, 1].
status validate(const sampling_options& options);

struct sampled_token {
  int32_t token = 0;
  /// `log_softmax(logits / T)[token]` over the whole vocabulary, before any
  /// top-k/top-p cut, with T = temperature, or T = 1 when greedy. Computed
  /// in double, returned as float.
  float logprob = 0.0F;
};

/// Samples one token from `logits`. `counter` is the index of the token
/// within its request: the random draw is a pure function of (seed,
/// counter), so the same seed and logits give the same token however the
/// request was batched. Fails on empty or non-finite logits.
result<sampled_token> sample(std::span<const float> logits, const sampling_options& options,
                             uint64_t counter);

struct generation_output {
  /// Generated tokens (EOS included when it ended the generation).
  std::vector<int32_t> tokens;
  /// Decoded generated text, cut before a matched stop string.
  std::string text;
  /// One per generated token.
  std::vector<float> logprobs;
  /// "stop" (EOS or a stop string), "length" (max_tokens or the context) or
  /// "abort" (cancelled).
  std::string finish_reason;
  uint32_t prompt_tokens = 0;
  /// Which served version produced which tokens (filled by the engine).
  std::vector<version_span> spans;
  /// Mixtures of experts: the experts every fed position was routed to
  /// (`sequence::routed_experts`: prompt and generated tokens but the last,
  /// `[position][layer][k]`), and which version's router chose them, as
  /// spans over positions (the spans filled by the engine).
  std::vector<int32_t> routed_experts;
  std::vector<version_span> routed_spans;
};

/// One request's decoding, step by step, so a scheduler can batch many
/// requests through `step`: feed `next_token()` to `seq()` (alone or batched),
/// hand the step's logits to `on_logits`, repeat until `done()`. The prompt
/// (BOS + bytes) is fed token by token; after its last token every step
/// samples the next one, until EOS, a stop string, `max_tokens` or
/// `max_position_embeddings`. The tokenizer must outlive the decoder.
class decoder {
public:
  /// Validates the options and the prompt's length against `config`.
  static result<decoder> start(const model_config& config, const tokenizer& tok,
                               std::string_view prompt, const sampling_options& options);

  bool done() const noexcept { return done_; }
  const model_config& config() const noexcept { return config_; }
  sequence& seq() noexcept { return *seq_; }
  /// The token to feed at the next step (precondition: not done).
  int32_t next_token() const noexcept;
  /// The logits `step` returned for `next_token()`.
  status on_logits(std::span<const float> logits);
  /// What was generated so far (text cut before a matched stop string).
  const generation_output& progress() const noexcept { return out_; }
  /// Ends the generation with "abort", keeping what was generated.
  void abort();
  generation_output finish() &&;

private:
  decoder(const model_config& config, const tokenizer& tok, const sampling_options& options);

  model_config config_;
  const tokenizer* tok_;
  sampling_options options_;
  std::vector<int32_t> prompt_;
  size_t fed_prompt_ = 0;
  int32_t pending_ = 0;
  size_t longest_stop_ = 0;
  bool done_ = false;
  std::unique_ptr<sequence> seq_;
  generation_output out_;
};

/// Generates for one request: the prompt (BOS + bytes) is fed token by token
/// through `step`, then tokens are sampled until EOS, a stop string,
/// `max_tokens` or `max_position_embeddings`.
result<generation_output> generate(const weights& w, const model_config& config,
                                   const tokenizer& tok, std::string_view prompt,
                                   const sampling_options& options);

/// Where a generation reads its weights at each step: a request in flight
/// across an in_place activation continues on the weights served when it
/// steps (DESIGN §1 Commit modes); its KV cache is kept.
using weights_source = std::function<std::shared_ptr<const weights>()>;

/// `generate` reading the weights from `current` before every step, and
/// finishing with "abort" as soon as `cancelled` returns true. Weights of
/// another shape mid-request are an error.
result<generation_output> generate(const weights_source& current, const tokenizer& tok,
                                   std::string_view prompt, const sampling_options& options,
                                   const std::function<bool()>& cancelled = {});

} // namespace stitch::engine
