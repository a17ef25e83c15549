#include "runtime/engine/model.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "gpu/cpu_parallel.hpp"

namespace stitch::engine {

namespace {

constexpr size_t rows_per_task = 32;
// Below this many multiply-adds a matmul runs on the calling thread: waking
// the pool would cost more than it saves. It never changes the result.
constexpr size_t parallel_threshold = size_t{1} << 16;

float silu(float x) noexcept {
  return x / (1.0F + std::exp(-x));
}

/// A replayed position's experts, when they are distinct ids of the layer;
/// else the error naming what is wrong.
std::optional<std::string> check_replay(const model_config& c, const sequence& s) {
  const size_t per_position = size_t{c.num_hidden_layers} * c.num_experts_per_tok;
  const size_t need = (size_t{s.position} + 1) * per_position;
  if (s.replay_experts.size() < need)
    return "the routing replay covers " + std::to_string(s.replay_experts.size() / per_position)
           + " positions, position " + std::to_string(s.position) + " needs one more";
  const int32_t* ids = &s.replay_experts[size_t{s.position} * per_position];
  for (size_t l = 0; l < c.num_hidden_layers; ++l) {
    const int32_t* layer = ids + l * c.num_experts_per_tok;
    for (size_t j = 0; j < c.num_experts_per_tok; ++j) {
      if (layer[j] < 0 || static_cast<uint32_t>(layer[j]) >= c.num_experts)
        return "the routing replay names expert " + std::to_string(layer[j]) + " at position "
               + std::to_string(s.position) + ", layer " + std::to_string(l) + " (the layer has "
               + std::to_string(c.num_experts) + ")";
      for (size_t i = 0; i < j; ++i)
        if (layer[i] == layer[j])
          return "the routing replay names expert " + std::to_string(layer[j])
                 + " twice at position " + std::to_string(s.position) + ", layer "
                 + std::to_string(l);
    }
  }
  return std::nullopt;
}

/// The sparse mixture of a qwen3_moe layer for the `n` rows of `xn` into
/// `out` (`n * hidden`): each row's router scores (softmax in float, as
/// Hugging Face computes them), its top-k experts (or the replayed ones), their
/// SwiGLU outputs mixed by the scores (renormalized over the chosen with
/// `norm_topk_prob`). Experts run over every row routed to them at once, in
/// expert order, so a row's sum is the same whatever shares its batch.
void moe_mlp(const model_config& c, const layer_weights& lw, size_t layer,
             std::span<sequence* const> batch, const float* xn, float* out, parallel_for& pool,
             std::vector<moe_trace>* trace) {
  const size_t n = batch.size();
  const size_t h = c.hidden_size;
  const size_t experts = c.num_experts;
  const size_t k = c.num_experts_per_tok;
  const size_t mi = c.moe_intermediate_size;
  std::vector<float> logits(n * experts);
  matmul(lw.router, xn, n, logits.data(), pool);
  std::vector<int32_t> chosen(n * k);
  std::vector<float> mix(n * k);
  std::vector<float> p(experts);
  std::vector<int32_t> own(k);
  for (size_t b = 0; b < n; ++b) {
    const float* score = &logits[b * experts];
    float top = -INFINITY;
    for (size_t e = 0; e < experts; ++e)
      top = std::max(top, score[e]);
    float total = 0.0F;
    for (size_t e = 0; e < experts; ++e)
      total += p[e] = std::exp(score[e] - top);
    for (size_t e = 0; e < experts; ++e)
      p[e] /= total;
    top_k(p.data(), experts, k, own.data());
    sequence& s = *batch[b];
    const int32_t* ids = own.data();
    if (!s.replay_experts.empty()) {
      ids = &s.replay_experts[(size_t{s.position} * c.num_hidden_layers + layer) * k];
      bool same = true;
      for (size_t j = 0; j < k; ++j)
        same = same && std::find(ids, ids + k, own[j]) != ids + k;
      s.replay_disagreements += same ? 0 : 1;
    }
    float sum = 0.0F;
    for (size_t j = 0; j < k; ++j) {
      chosen[b * k + j] = ids[j];
      sum += mix[b * k + j] = p[static_cast<size_t>(ids[j])];
    }
    if (c.norm_topk_prob)
      for (size_t j = 0; j < k; ++j)
        mix[b * k + j] /= sum;
    s.routed_experts.insert(s.routed_experts.end(), ids, ids + k);
    if (trace) {
      auto& t = (*trace)[b];
      t.input.assign(xn + b * h, xn + (b + 1) * h);
      t.router_logits.assign(score, score + experts);
      t.experts.assign(ids, ids + k);
      t.expert_outputs.assign(k * h, 0.0F);
    }
  }
  std::fill(out, out + n * h, 0.0F);
  std::vector<size_t> rows;
  std::vector<float> xin, gate, up, y;
  for (size_t e = 0; e < experts; ++e) {
    rows.clear();
    for (size_t r = 0; r < n * k; ++r)
      if (static_cast<size_t>(chosen[r]) == e)
        rows.push_back(r);
    if (rows.empty())
      continue;
    const size_t m = rows.size();
    xin.resize(m * h);
    gate.resize(m * mi);
    up.resize(m * mi);
    y.resize(m * h);
    for (size_t i = 0; i < m; ++i)
      std::copy(xn + rows[i] / k * h, xn + (rows[i] / k + 1) * h,
                xin.begin() + static_cast<ptrdiff_t>(i * h));
    const expert_weights& ex = lw.experts[e];
    matmul(ex.gate_proj, xin.data(), m, gate.data(), pool);
    matmul(ex.up_proj, xin.data(), m, up.data(), pool);
    for (size_t i = 0; i < m * mi; ++i)
      gate[i] = silu(gate[i]) * up[i];
    matmul(ex.down_proj, gate.data(), m, y.data(), pool);
    for (size_t i = 0; i < m; ++i) {
      const size_t b = rows[i] / k;
      const float weight = mix[rows[i]];
      for (size_t d = 0; d < h; ++d)
        out[b * h + d] += weight * y[i * h + d];
      if (trace)
        std::copy(y.begin() + static_cast<ptrdiff_t>(i * h),
                  y.begin() + static_cast<ptrdiff_t>((i + 1) * h),
                  (*trace)[b].expert_outputs.begin() + static_cast<ptrdiff_t>((rows[i] % k) * h));
    }
  }
}

} // namespace

void top_k(const float* scores, size_t n, size_t k, int32_t* out) noexcept {
  for (size_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (size_t e = 0; e < n; ++e) {
      if (std::find(out, out + j, static_cast<int32_t>(e)) != out + j)
        continue;
      if (best < 0 || scores[e] > scores[static_cast<size_t>(best)])
        best = static_cast<int32_t>(e);
    }
    out[j] = best;
  }
}

sequence::sequence(const model_config& config)
    : keys(config.num_hidden_layers), values(config.num_hidden_layers) {}

[[gnu::noinline]] float dot(const float* __restrict a, const float* __restrict b,
                            size_t n) noexcept {
  constexpr size_t lanes = 16;
  float acc[lanes] = {};
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (size_t j = 0; j < lanes; ++j) {
      acc[j] += a[i + j] * b[i + j];
    }
  }
  for (size_t width = lanes / 2; width > 0; width /= 2) {
    for (size_t j = 0; j < width; ++j) {
      acc[j] += acc[j + width];
    }
  }
  float tail = 0.0F;
  for (; i < n; ++i) {
    tail += a[i] * b[i];
  }
  return acc[0] + tail;
}

void matmul(const matrix& w, const float* x, size_t batch, float* y, parallel_for& pool) {
  size_t rows = w.rows;
  size_t cols = w.cols;
  size_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  auto run_task = [&](size_t task) {
    size_t end = std::min(rows, (task + 1) * rows_per_task);
    for (size_t r = task * rows_per_task; r < end; ++r) {
      const float* row = w.row(static_cast<uint32_t>(r));
      for (size_t b = 0; b < batch; ++b) {
        y[b * rows + r] = dot(row, x + b * cols, cols);
      }
    }
  };
  if (rows * cols * batch < parallel_threshold || tasks == 1) {
    for (size_t t = 0; t < tasks; ++t) {
      run_task(t);
    }
  } else {
    pool.run(tasks, run_task);
  }
}

void rms_norm(const float* x, const float* weight, size_t n, double eps, float* out) noexcept {
  float sum = 0.0F;
  for (size_t i = 0; i < n; ++i) {
    sum += x[i] * x[i];
  }
  float scale = 1.0F / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  for (size_t i = 0; i < n; ++i) {
    out[i] = weight[i] * (x[i] * scale);
  }
}

void apply_rope(float* head, uint32_t head_dim, uint32_t position, double theta) noexcept {
  uint32_t half = head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
    double angle = static_cast<double>(position) * inv_freq;
    auto c = static_cast<float>(std::cos(angle));
    auto s = static_cast<float>(std::sin(angle));
    float x1 = head[i];
    float x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

result<step_logits> step(const weights& w, std::span<sequence* const> batch,
                         std::span<const int32_t> next_tokens, parallel_for& pool,
                         step_logits* hidden, std::vector<moe_trace>* last_moe) {
  const model_config& c = w.config;
  if (batch.size() != next_tokens.size()) {
    return make_error(errc::invalid_argument, "step: " + std::to_string(batch.size())
                                                + " sequences but "
                                                + std::to_string(next_tokens.size()) + " tokens");
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const sequence* s = batch[i];
    if (s == nullptr || s->keys.size() != c.num_hidden_layers) {
      return make_error(errc::invalid_argument,
                        "step: sequence " + std::to_string(i) + " was not made for this model");
    }
    if (next_tokens[i] < 0 || static_cast<uint32_t>(next_tokens[i]) >= c.vocab_size) {
      return make_error(errc::invalid_argument, "step: token " + std::to_string(next_tokens[i])
                                                  + " is outside the vocabulary");
    }
    if (s->position >= c.max_position_embeddings) {
      return make_error(errc::limit_exceeded, "step: sequence " + std::to_string(i)
                                                + " is at max_position_embeddings "
                                                + std::to_string(c.max_position_embeddings));
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch[j] == s) {
        return make_error(errc::invalid_argument,
                          "step: sequence " + std::to_string(i) + " is in the batch twice");
      }
    }
    if (!s->replay_experts.empty()) {
      if (!c.is_moe())
        return make_error(errc::invalid_argument,
                          "step: sequence " + std::to_string(i)
                            + " replays routing, but the model has no experts");
      if (auto bad = check_replay(c, *s))
        return make_error(errc::invalid_argument,
                          "step: sequence " + std::to_string(i) + ": " + *bad);
    }
  }
  if (last_moe)
    last_moe->assign(c.is_moe() ? batch.size() : 0, moe_trace{});

  const size_t n = batch.size();
  const size_t h = c.hidden_size;
  const size_t hd = c.head_dim();
  const size_t kvw = c.kv_width();
  const size_t im = c.intermediate_size;
  const size_t group = c.num_attention_heads / c.num_key_value_heads;
  const float attn_scale = 1.0F / std::sqrt(static_cast<float>(hd));

  std::vector<float> x(n * h);
  std::vector<float> xn(n * h);
  std::vector<float> q(n * h);
  std::vector<float> k(n * kvw);
  std::vector<float> v(n * kvw);
  std::vector<float> attn(n * h);
  std::vector<float> proj(n * h);
  std::vector<float> gate(c.is_moe() ? 0 : n * im);
  std::vector<float> up(c.is_moe() ? 0 : n * im);

  for (size_t b = 0; b < n; ++b) {
    const float* e = w.embed_tokens.row(static_cast<uint32_t>(next_tokens[b]));
    std::copy(e, e + h, x.begin() + static_cast<ptrdiff_t>(b * h));
  }

  for (size_t l = 0; l < c.num_hidden_layers; ++l) {
    const layer_weights& lw = w.layers[l];
    for (size_t b = 0; b < n; ++b) {
      rms_norm(&x[b * h], lw.input_layernorm.data(), h, c.rms_norm_eps, &xn[b * h]);
    }
    matmul(lw.q_proj, xn.data(), n, q.data(), pool);
    matmul(lw.k_proj, xn.data(), n, k.data(), pool);
    matmul(lw.v_proj, xn.data(), n, v.data(), pool);
    for (size_t b = 0; b < n; ++b) {
      sequence& s = *batch[b];
      for (size_t head = 0; head < c.num_attention_heads; ++head) {
        float* qh = &q[b * h + head * hd];
        if (c.is_moe())
          rms_norm(qh, lw.q_norm.data(), hd, c.rms_norm_eps, qh);
        apply_rope(qh, static_cast<uint32_t>(hd), s.position, c.rope_theta);
      }
      for (size_t head = 0; head < c.num_key_value_heads; ++head) {
        float* kh = &k[b * kvw + head * hd];
        if (c.is_moe())
          rms_norm(kh, lw.k_norm.data(), hd, c.rms_norm_eps, kh);
        apply_rope(kh, static_cast<uint32_t>(hd), s.position, c.rope_theta);
      }
      auto& keys = s.keys[l];
      auto& values = s.values[l];
      keys.insert(keys.end(), k.begin() + static_cast<ptrdiff_t>(b * kvw),
                  k.begin() + static_cast<ptrdiff_t>((b + 1) * kvw));
      values.insert(values.end(), v.begin() + static_cast<ptrdiff_t>(b * kvw),
                    v.begin() + static_cast<ptrdiff_t>((b + 1) * kvw));
    }
    auto attend = [&](size_t task) {
      size_t b = task / c.num_attention_heads;
      size_t head = task % c.num_attention_heads;
      const sequence& s = *batch[b];
      size_t len = size_t{s.position} + 1;
      size_t kv_head = head / group;
      const float* qh = &q[b * h + head * hd];
      std::vector<float> scores(len);
      float top = -INFINITY;
      for (size_t p = 0; p < len; ++p) {
        scores[p] = dot(qh, &s.keys[l][p * kvw + kv_head * hd], hd) * attn_scale;
        top = std::max(top, scores[p]);
      }
      float total = 0.0F;
      for (size_t p = 0; p < len; ++p) {
        scores[p] = std::exp(scores[p] - top);
        total += scores[p];
      }
      float* out = &attn[b * h + head * hd];
      std::fill(out, out + hd, 0.0F);
      for (size_t p = 0; p < len; ++p) {
        float weight = scores[p] / total;
        const float* vp = &s.values[l][p * kvw + kv_head * hd];
        for (size_t d = 0; d < hd; ++d) {
          out[d] += weight * vp[d];
        }
      }
    };
    size_t attention_tasks = n * c.num_attention_heads;
    size_t attention_work = 0;
    for (size_t b = 0; b < n; ++b) {
      attention_work += (size_t{batch[b]->position} + 1) * h * 2;
    }
    if (attention_tasks == 1 || attention_work < parallel_threshold) {
      for (size_t t = 0; t < attention_tasks; ++t) {
        attend(t);
      }
    } else {
      pool.run(attention_tasks, attend);
    }
    matmul(lw.o_proj, attn.data(), n, proj.data(), pool);
    for (size_t i = 0; i < n * h; ++i) {
      x[i] += proj[i];
    }
    for (size_t b = 0; b < n; ++b) {
      rms_norm(&x[b * h], lw.post_attention_layernorm.data(), h, c.rms_norm_eps, &xn[b * h]);
    }
    if (c.is_moe()) {
      const bool last = l + 1 == c.num_hidden_layers;
      moe_mlp(c, lw, l, batch, xn.data(), proj.data(), pool, last ? last_moe : nullptr);
    } else {
      matmul(lw.gate_proj, xn.data(), n, gate.data(), pool);
      matmul(lw.up_proj, xn.data(), n, up.data(), pool);
      for (size_t i = 0; i < n * im; ++i) {
        gate[i] = silu(gate[i]) * up[i];
      }
      matmul(lw.down_proj, gate.data(), n, proj.data(), pool);
    }
    for (size_t i = 0; i < n * h; ++i) {
      x[i] += proj[i];
    }
  }
  if (last_moe)
    for (size_t b = 0; b < last_moe->size(); ++b)
      (*last_moe)[b].residual.assign(x.begin() + static_cast<ptrdiff_t>(b * h),
                                     x.begin() + static_cast<ptrdiff_t>((b + 1) * h));

  for (size_t b = 0; b < n; ++b) {
    rms_norm(&x[b * h], w.norm.data(), h, c.rms_norm_eps, &xn[b * h]);
  }
  std::vector<float> all_logits(n * c.vocab_size);
  matmul(w.lm_head, xn.data(), n, all_logits.data(), pool);
  step_logits out(n);
  for (size_t b = 0; b < n; ++b) {
    auto first = all_logits.begin() + static_cast<ptrdiff_t>(b * c.vocab_size);
    out[b].assign(first, first + c.vocab_size);
    ++batch[b]->position;
  }
  if (hidden) {
    hidden->resize(n);
    for (size_t b = 0; b < n; ++b)
      (*hidden)[b].assign(xn.begin() + static_cast<ptrdiff_t>(b * h),
                          xn.begin() + static_cast<ptrdiff_t>((b + 1) * h));
  }
  return out;
}

result<step_logits> step(const weights& w, std::span<sequence* const> batch,
                         std::span<const int32_t> next_tokens) {
  return step(w, batch, next_tokens, gpu::shared_pool());
}

} // namespace stitch::engine
