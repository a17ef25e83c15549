#include "runtime/engine/policy_gradient.hpp"

#include <cmath>
#include <cstring>

#include "gpu/cpu_parallel.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch::engine {

namespace {

std::string router_name(const model_config& c) {
  return "model.layers." + std::to_string(c.num_hidden_layers - 1) + ".mlp.gate.weight";
}

/// `tensor += step * grad` over fp32 bytes.
void ascend(std::vector<std::byte>& bytes, const std::vector<double>& grad, double step) {
  for (size_t i = 0; i < grad.size(); ++i) {
    float f;
    std::memcpy(&f, bytes.data() + i * sizeof(float), sizeof f);
    f = static_cast<float>(f + step * grad[i]);
    std::memcpy(bytes.data() + i * sizeof(float), &f, sizeof f);
  }
}

/// Adds `scale * d log p(a) / d router` of the last layer to `out`
/// (`num_experts x hidden`), `p` the softmax of this step's logits (without
/// the 1/T, which `scale` carries). The path: logits = lm_head . norm(z), z =
/// the residual + sum_j w_j E_j(x), w the router's softmax scores of the
/// experts used (renormalized over them with norm_topk_prob), scores =
/// router . x.
void add_router_gradient(const weights& w, const moe_trace& t, int32_t a,
                         const std::vector<double>& p, double scale, std::vector<double>& out) {
  const model_config& c = w.config;
  const size_t h = c.hidden_size;
  const size_t vocab = c.vocab_size;
  const size_t experts = c.num_experts;
  const size_t k = c.num_experts_per_tok;
  // d/d xn: the head's rows weighted by (1[v = a] - p_v).
  std::vector<double> dxn(h, 0.0);
  for (size_t v = 0; v < vocab; ++v) {
    const double g = (static_cast<size_t>(a) == v ? 1.0 : 0.0) - p[v];
    const float* row = w.lm_head.row(static_cast<uint32_t>(v));
    for (size_t j = 0; j < h; ++j)
      dxn[j] += g * row[j];
  }
  // Through the final RMSNorm: xn = g * z * r, r = 1 / sqrt(mean(z^2) + eps).
  double mean_square = 0;
  for (size_t j = 0; j < h; ++j)
    mean_square += double{t.residual[j]} * t.residual[j];
  mean_square /= static_cast<double>(h);
  const double r = 1.0 / std::sqrt(mean_square + c.rms_norm_eps);
  std::vector<double> u(h);
  double uz = 0;
  for (size_t j = 0; j < h; ++j) {
    u[j] = double{w.norm[j]} * dxn[j];
    uz += u[j] * t.residual[j];
  }
  std::vector<double> dz(h);
  for (size_t j = 0; j < h; ++j)
    dz[j] = r * u[j] - r * r * r * t.residual[j] * uz / static_cast<double>(h);
  // Into the mixing weights, then the router's scores.
  std::vector<double> dw(k, 0.0);
  for (size_t j = 0; j < k; ++j)
    for (size_t d = 0; d < h; ++d)
      dw[j] += dz[d] * t.expert_outputs[j * h + d];
  double top = -INFINITY;
  for (size_t e = 0; e < experts; ++e)
    top = std::max(top, double{t.router_logits[e]});
  std::vector<double> prob(experts);
  double total = 0;
  for (size_t e = 0; e < experts; ++e)
    total += prob[e] = std::exp(t.router_logits[e] - top);
  for (auto& q : prob)
    q /= total;
  std::vector<double> ds(experts, 0.0);
  if (c.norm_topk_prob) {
    // w_j = exp(s_j) / sum over the used experts: a softmax over them.
    double used = 0;
    for (size_t j = 0; j < k; ++j)
      used += prob[static_cast<size_t>(t.experts[j])];
    double mean = 0;
    std::vector<double> wj(k);
    for (size_t j = 0; j < k; ++j) {
      wj[j] = prob[static_cast<size_t>(t.experts[j])] / used;
      mean += dw[j] * wj[j];
    }
    for (size_t j = 0; j < k; ++j)
      ds[static_cast<size_t>(t.experts[j])] += wj[j] * (dw[j] - mean);
  } else {
    // w_j = p_j, the softmax over every expert.
    double mean = 0;
    for (size_t j = 0; j < k; ++j)
      mean += dw[j] * prob[static_cast<size_t>(t.experts[j])];
    for (size_t j = 0; j < k; ++j)
      ds[static_cast<size_t>(t.experts[j])] += dw[j] * prob[static_cast<size_t>(t.experts[j])];
    for (size_t e = 0; e < experts; ++e)
      ds[e] -= prob[e] * mean;
  }
  for (size_t e = 0; e < experts; ++e) {
    if (ds[e] == 0)
      continue;
    double* row = &out[e * h];
    for (size_t d = 0; d < h; ++d)
      row[d] += scale * ds[e] * t.input[d];
  }
}

} // namespace

result<pg_stats> policy_gradient_step(pipeline::tensor_set& tensors, const model_config& config,
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
  const bool train_router = config.is_moe() && o.router_learning_rate != 0;
  const size_t experts = config.num_experts;
  std::vector<double> router_grad(train_router ? experts * hidden : 0, 0.0);
  std::vector<moe_trace> trace;
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
    if (!s.routed_experts.empty()) {
      const size_t rows = feed.size() + s.tokens.size() - 1;
      const size_t per_row = size_t{config.num_hidden_layers} * config.num_experts_per_tok;
      if (!config.is_moe())
        return make_error(errc::invalid_argument,
                          "policy_gradient_step: a sample has routed experts, but the model has "
                          "no experts");
      if (s.routed_experts.size() != rows * per_row)
        return make_error(errc::invalid_argument,
                          "policy_gradient_step: a sample's routed experts hold "
                            + std::to_string(s.routed_experts.size()) + " ids, its "
                            + std::to_string(rows) + " fed positions need "
                            + std::to_string(rows * per_row));
      seq.replay_experts = s.routed_experts;
      stats.routing_decisions += rows * config.num_hidden_layers;
    }
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
      auto r = step(w, one, t, gpu::shared_pool(), &h, train_router ? &trace : nullptr);
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
      if (train_router && scale != 0)
        add_router_gradient(w, trace[0], a, p, scale / o.temperature, router_grad);
      next = a;
    }
    stats.routing_disagreements += seq.replay_disagreements;
  }
  stats.mean_importance_weight = stats.tokens ? weight_sum / static_cast<double>(stats.tokens) : 0;
  stats.mean_token_staleness = stats.tokens ? staleness_sum / static_cast<double>(stats.tokens) : 0;
  auto& bytes = head->second.bytes;
  if (bytes.size() != vocab * hidden * sizeof(float))
    return make_error(errc::invalid_argument,
                      "policy_gradient_step: lm_head.weight has the wrong size");
  if (train_router) {
    auto router = tensors.find(router_name(config));
    if (router == tensors.end() || router->second.bytes.size() != experts * hidden * sizeof(float))
      return make_error(errc::invalid_argument, "policy_gradient_step: " + router_name(config)
                                                  + " is missing or the wrong size");
    ascend(router->second.bytes, router_grad,
           o.router_learning_rate / static_cast<double>(batch.size()));
  }
  ascend(bytes, grad, o.learning_rate / static_cast<double>(batch.size()));
  return stats;
}

} // namespace stitch::engine
