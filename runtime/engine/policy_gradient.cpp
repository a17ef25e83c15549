#include "runtime/engine/policy_gradient.hpp"

#include <cmath>
#include <cstring>

#include "gpu/cpu_parallel.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch::engine {

result<pg_stats> policy_gradient_step(store::tensor_set& tensors, const model_config& config,
                                      std::span<const rollout_sample> batch, const pg_options& o) {
  if (config.torch_dtype != weight_dtype::float32)
    return make_error(
      errc::invalid_argument,
      "policy_gradient_step: lm_head is bfloat16; the built-in trainer needs float32");
  if (!(o.temperature > 0) || !(o.clip > 0) || !std::isfinite(o.learning_rate))
    return make_error(errc::invalid_argument,
                      "policy_gradient_step: temperature and clip must be positive");
  if (!(o.staleness_decay > 0) || o.staleness_decay > 1)
    return make_error(errc::invalid_argument,
                      "policy_gradient_step: staleness_decay must be in (0, 1]");
  auto head = tensors.find("lm_head.weight");
  if (head == tensors.end())
    return make_error(errc::invalid_argument, "policy_gradient_step: no lm_head.weight");
  auto built = build_weights(config, tensors);
  if (!built)
    return std::move(built).error();
  const weights& w = **built;
  const size_t hidden = config.hidden_size;
  const size_t vocab = config.vocab_size;
  pg_stats stats;
  if (batch.empty())
    return stats;
  double baseline = 0;
  for (const auto& s : batch)
    baseline += s.reward;
  baseline /= static_cast<double>(batch.size());
  stats.mean_reward = baseline;

  std::vector<double> grad(vocab * hidden, 0.0);
  double weight_sum = 0;
  tokenizer tok;
  double staleness_sum = 0;
  for (const auto& s : batch) {
    if (s.behaviour_logprobs.size() != s.tokens.size())
      return make_error(errc::invalid_argument, "policy_gradient_step: a sample has "
                                                  + std::to_string(s.tokens.size()) + " tokens but "
                                                  + std::to_string(s.behaviour_logprobs.size())
                                                  + " logprobs");
    if (!s.token_versions.empty() && s.token_versions.size() != s.tokens.size())
      return make_error(errc::invalid_argument, "policy_gradient_step: a sample has "
                                                  + std::to_string(s.tokens.size()) + " tokens but "
                                                  + std::to_string(s.token_versions.size())
                                                  + " token versions");
    const double advantage = s.reward - baseline;
    std::vector<int32_t> feed = tok.encode(s.prompt);
    if (feed.size() + s.tokens.size() > config.max_position_embeddings)
      return make_error(errc::limit_exceeded, "policy_gradient_step: a sample is longer than "
                                              "max_position_embeddings");
    sequence seq(config);
    sequence* one[] = {&seq};
    step_logits logits, h;
    // Teacher-force the prompt, then each sampled token; the state after
    // feeding position i predicts token i + 1.
    for (size_t i = 0; i + 1 < feed.size(); ++i) {
      int32_t t[] = {feed[i]};
      if (auto r = step(w, one, t, gpu::shared_pool(), nullptr); !r)
        return std::move(r).error();
    }
    int32_t next = feed.back();
    for (size_t k = 0; k < s.tokens.size(); ++k) {
      int32_t t[] = {next};
      auto r = step(w, one, t, gpu::shared_pool(), &h);
      if (!r)
        return std::move(r).error();
      const auto& l = (*r)[0];
      const auto& x = h[0];
      const int32_t a = s.tokens[k];
      if (a < 0 || static_cast<size_t>(a) >= vocab)
        return make_error(errc::invalid_argument, "policy_gradient_step: token out of range");
      // Softmax at the sampling temperature, in double.
      double top = l[0] / o.temperature;
      for (size_t v = 1; v < vocab; ++v)
        top = std::max(top, l[v] / o.temperature);
      std::vector<double> p(vocab);
      double total = 0;
      for (size_t v = 0; v < vocab; ++v)
        total += p[v] = std::exp(l[v] / o.temperature - top);
      for (auto& pv : p)
        pv /= total;
      const double current = std::log(std::max(p[static_cast<size_t>(a)], 1e-300));
      const double ratio = std::exp(current - s.behaviour_logprobs[k]);
      const double iw = std::min(o.clip, ratio);
      weight_sum += iw;
      ++stats.tokens;
      const uint64_t made_by = s.token_versions.empty() ? s.version : s.token_versions[k];
      const uint64_t behind = o.current_version - std::min(o.current_version, made_by);
      staleness_sum += static_cast<double>(behind);
      stats.crossed_tokens += made_by != s.version ? 1 : 0;
      const double decay =
        o.staleness_decay == 1.0 ? 1.0 : std::pow(o.staleness_decay, static_cast<double>(behind));
      const double scale = advantage * iw * decay / o.temperature;
      if (scale != 0)
        for (size_t v = 0; v < vocab; ++v) {
          const double g = scale * ((static_cast<size_t>(a) == v ? 1.0 : 0.0) - p[v]);
          double* row = &grad[v * hidden];
          for (size_t j = 0; j < hidden; ++j)
            row[j] += g * x[j];
        }
      next = a;
    }
  }
  stats.mean_importance_weight = stats.tokens ? weight_sum / static_cast<double>(stats.tokens) : 0;
  stats.mean_token_staleness = stats.tokens ? staleness_sum / static_cast<double>(stats.tokens) : 0;
  auto& bytes = head->second.bytes;
  if (bytes.size() != vocab * hidden * sizeof(float))
    return make_error(errc::invalid_argument,
                      "policy_gradient_step: lm_head.weight has the wrong size");
  const double step_size = o.learning_rate / static_cast<double>(batch.size());
  for (size_t i = 0; i < vocab * hidden; ++i) {
    float f;
    std::memcpy(&f, bytes.data() + i * sizeof(float), sizeof f);
    f = static_cast<float>(f + step_size * grad[i]);
    std::memcpy(bytes.data() + i * sizeof(float), &f, sizeof f);
  }
  return stats;
}

} // namespace stitch::engine
