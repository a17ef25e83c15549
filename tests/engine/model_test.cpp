#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/cpu_parallel.hpp"
#include "runtime/engine/model.hpp"

namespace stitch::engine {
namespace {

using vec = std::vector<double>;

model_config one_layer() {
  auto c = *preset("tiny");
  c.num_hidden_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.rope_theta = 500.0;
  return c;
}

std::shared_ptr<const weights> make_weights(const model_config& c, uint64_t seed) {
  auto set = random_init(c, seed);
  EXPECT_TRUE(set);
  auto w = build_weights(c, *set);
  EXPECT_TRUE(w);
  return *w;
}

// A straightforward double-precision Llama written from the HF modelling
// code, recomputing every position from scratch (no cache).
vec ref_matvec(const matrix& m, const vec& x) {
  vec y(m.rows, 0.0);
  for (uint32_t r = 0; r < m.rows; ++r) {
    for (uint32_t i = 0; i < m.cols; ++i) {
      y[r] += double{m.row(r)[i]} * x[i];
    }
  }
  return y;
}

vec ref_rms_norm(const vec& x, std::span<const float> w, double eps) {
  double sq = 0;
  for (double v : x) {
    sq += v * v;
  }
  double inv = 1.0 / std::sqrt(sq / static_cast<double>(x.size()) + eps);
  vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = w[i] * x[i] * inv;
  }
  return out;
}

// q * cos + rotate_half(q) * sin, with rotate_half(x) = cat(-x2, x1).
void ref_rope(double* head, size_t d, size_t pos, double theta) {
  vec x(head, head + d);
  for (size_t j = 0; j < d; ++j) {
    size_t i = j % (d / 2);
    double angle = static_cast<double>(pos) / std::pow(theta, 2.0 * static_cast<double>(i) / d);
    double rotated = j < d / 2 ? -x[j + d / 2] : x[j - d / 2];
    head[j] = x[j] * std::cos(angle) + rotated * std::sin(angle);
  }
}

// Qwen3-MoE's sparse block (HF Qwen3MoeSparseMoeBlock) for one position:
// softmax router scores, top-k (lowest id first on ties), renormalized with
// norm_topk_prob, each chosen expert's SwiGLU output mixed in; appends the
// chosen ids to `routed`.
vec ref_moe(const model_config& c, const layer_weights& lw, const vec& xn,
            std::vector<int32_t>& routed) {
  vec s = ref_matvec(lw.router, xn);
  double top = *std::max_element(s.begin(), s.end());
  double total = 0;
  for (double& v : s) {
    v = std::exp(v - top);
    total += v;
  }
  for (double& v : s)
    v /= total;
  std::vector<int32_t> ids;
  for (uint32_t j = 0; j < c.num_experts_per_tok; ++j) {
    int32_t best = -1;
    for (uint32_t e = 0; e < c.num_experts; ++e)
      if (std::find(ids.begin(), ids.end(), static_cast<int32_t>(e)) == ids.end()
          && (best < 0 || s[e] > s[static_cast<size_t>(best)]))
        best = static_cast<int32_t>(e);
    ids.push_back(best);
  }
  double sum = 0;
  for (int32_t id : ids)
    sum += s[static_cast<size_t>(id)];
  vec out(c.hidden_size, 0.0);
  for (int32_t id : ids) {
    const auto& ex = lw.experts[static_cast<size_t>(id)];
    vec g = ref_matvec(ex.gate_proj, xn);
    vec u = ref_matvec(ex.up_proj, xn);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    vec d = ref_matvec(ex.down_proj, g);
    double weight = s[static_cast<size_t>(id)] / (c.norm_topk_prob ? sum : 1.0);
    for (size_t i = 0; i < out.size(); ++i)
      out[i] += weight * d[i];
  }
  routed.insert(routed.end(), ids.begin(), ids.end());
  return out;
}

// Per-head RMSNorm (Qwen3's q_norm / k_norm) of `heads` heads in place.
void ref_head_norm(vec& x, size_t heads, size_t hd, std::span<const float> w, double eps) {
  for (size_t hh = 0; hh < heads; ++hh) {
    vec head(x.begin() + static_cast<ptrdiff_t>(hh * hd),
             x.begin() + static_cast<ptrdiff_t>((hh + 1) * hd));
    head = ref_rms_norm(head, w, eps);
    std::copy(head.begin(), head.end(), x.begin() + static_cast<ptrdiff_t>(hh * hd));
  }
}

// With `routed` (a mixture of experts), the experts every position chose,
// `[position][layer][k]`.
vec reference_logits(const weights& w, const std::vector<int32_t>& tokens,
                     std::vector<int32_t>* routed = nullptr) {
  const auto& c = w.config;
  size_t h = c.hidden_size;
  size_t hd = c.head_dim();
  size_t n = tokens.size();
  std::vector<vec> x(n);
  for (size_t t = 0; t < n; ++t) {
    const float* e = w.embed_tokens.row(static_cast<uint32_t>(tokens[t]));
    x[t].assign(e, e + h);
  }
  std::vector<std::vector<int32_t>> chosen(n);
  for (const auto& lw : w.layers) {
    std::vector<vec> q(n);
    std::vector<vec> k(n);
    std::vector<vec> v(n);
    for (size_t t = 0; t < n; ++t) {
      vec xn = ref_rms_norm(x[t], lw.input_layernorm, c.rms_norm_eps);
      q[t] = ref_matvec(lw.q_proj, xn);
      k[t] = ref_matvec(lw.k_proj, xn);
      v[t] = ref_matvec(lw.v_proj, xn);
      if (c.is_moe()) {
        ref_head_norm(q[t], c.num_attention_heads, hd, lw.q_norm, c.rms_norm_eps);
        ref_head_norm(k[t], c.num_key_value_heads, hd, lw.k_norm, c.rms_norm_eps);
      }
      for (size_t hh = 0; hh < c.num_attention_heads; ++hh) {
        ref_rope(&q[t][hh * hd], hd, t, c.rope_theta);
      }
      for (size_t hh = 0; hh < c.num_key_value_heads; ++hh) {
        ref_rope(&k[t][hh * hd], hd, t, c.rope_theta);
      }
    }
    size_t group = c.num_attention_heads / c.num_key_value_heads;
    for (size_t t = 0; t < n; ++t) {
      vec attn(h, 0.0);
      for (size_t hh = 0; hh < c.num_attention_heads; ++hh) {
        size_t kvh = hh / group;
        vec scores(t + 1);
        double top = -1e300;
        for (size_t p = 0; p <= t; ++p) {
          double s = 0;
          for (size_t d = 0; d < hd; ++d) {
            s += q[t][hh * hd + d] * k[p][kvh * hd + d];
          }
          scores[p] = s / std::sqrt(static_cast<double>(hd));
          top = std::max(top, scores[p]);
        }
        double total = 0;
        for (double& s : scores) {
          s = std::exp(s - top);
          total += s;
        }
        for (size_t p = 0; p <= t; ++p) {
          for (size_t d = 0; d < hd; ++d) {
            attn[hh * hd + d] += scores[p] / total * v[p][kvh * hd + d];
          }
        }
      }
      vec o = ref_matvec(lw.o_proj, attn);
      for (size_t i = 0; i < h; ++i) {
        x[t][i] += o[i];
      }
      vec xn = ref_rms_norm(x[t], lw.post_attention_layernorm, c.rms_norm_eps);
      if (c.is_moe()) {
        vec m = ref_moe(c, lw, xn, chosen[t]);
        for (size_t i = 0; i < h; ++i)
          x[t][i] += m[i];
        continue;
      }
      vec g = ref_matvec(lw.gate_proj, xn);
      vec u = ref_matvec(lw.up_proj, xn);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      }
      vec d = ref_matvec(lw.down_proj, g);
      for (size_t i = 0; i < h; ++i) {
        x[t][i] += d[i];
      }
    }
  }
  if (routed) {
    routed->clear();
    for (const auto& ids : chosen)
      routed->insert(routed->end(), ids.begin(), ids.end());
  }
  return ref_matvec(w.lm_head, ref_rms_norm(x[n - 1], w.norm, c.rms_norm_eps));
}

// Random weights of std 0.02 give almost-flat logits; scale them up so the
// comparison exercises real numerics (norms away from 1, peaked attention).
std::shared_ptr<const weights> loud_weights(const model_config& c, uint64_t seed) {
  auto set = random_init(c, seed);
  EXPECT_TRUE(set);
  EXPECT_EQ(c.torch_dtype, weight_dtype::float32);
  auto floats = [&](const std::string& name) {
    auto& bytes = set->at(name).bytes;
    return std::span<float>{reinterpret_cast<float*>(bytes.data()), bytes.size() / 4};
  };
  auto scale = [&](const std::string& name, float f) {
    for (float& v : floats(name))
      v *= f;
  };
  scale("model.embed_tokens.weight", 50.0F);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m :
         {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
      scale(p + m + ".weight", 20.0F);
    if (c.is_moe()) {
      scale(p + "mlp.gate.weight", 40.0F);
      for (uint32_t e = 0; e < c.num_experts; ++e)
        for (const char* m : {"gate_proj", "up_proj", "down_proj"})
          scale(p + "mlp.experts." + std::to_string(e) + "." + m + ".weight", 20.0F);
      auto qn = floats(p + "self_attn.q_norm.weight");
      auto kn = floats(p + "self_attn.k_norm.weight");
      for (size_t i = 0; i < qn.size(); ++i) {
        qn[i] = 0.8F + 0.04F * static_cast<float>(i % 6);
        kn[i] = 1.2F - 0.05F * static_cast<float>(i % 4);
      }
    } else {
      for (const char* m : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
        scale(p + m + ".weight", 20.0F);
    }
    auto in = floats(p + "input_layernorm.weight");
    auto post = floats(p + "post_attention_layernorm.weight");
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = 0.5F + 0.05F * static_cast<float>(i % 7);
      post[i] = 1.5F - 0.03F * static_cast<float>(i % 5);
    }
  }
  scale("lm_head.weight", 20.0F);
  auto w = build_weights(c, *set);
  EXPECT_TRUE(w);
  return *w;
}

void expect_close(const std::vector<float>& got, const vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double v : want) {
    scale = std::max(scale, std::abs(v));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, scale)) << "logit " << i;
  }
}

TEST(model, rms_norm_matches_reference) {
  std::vector<float> x{1.0F, -2.0F, 3.5F, 0.25F};
  std::vector<float> w{1.0F, 0.5F, 2.0F, -1.0F};
  std::vector<float> out(4);
  rms_norm(x.data(), w.data(), 4, 1e-5, out.data());
  vec want = ref_rms_norm(vec(x.begin(), x.end()), w, 1e-5);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[i], want[i], 1e-6);
  }
}

TEST(model, rope_matches_rotate_half_reference) {
  for (uint32_t pos : {0u, 1u, 7u, 300u}) {
    std::vector<float> head(16);
    vec ref(16);
    for (size_t i = 0; i < 16; ++i) {
      head[i] = static_cast<float>(i) * 0.1F - 0.7F;
      ref[i] = head[i];
    }
    apply_rope(head.data(), 16, pos, 10000.0);
    ref_rope(ref.data(), 16, pos, 10000.0);
    for (size_t i = 0; i < 16; ++i) {
      EXPECT_NEAR(head[i], ref[i], 1e-5) << "pos " << pos << " dim " << i;
    }
  }
}

TEST(model, dot_handles_every_length) {
  for (size_t n : {0u, 1u, 15u, 16u, 17u, 64u, 100u}) {
    std::vector<float> a(n);
    std::vector<float> b(n);
    double want = 0;
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(i % 5) - 2.0F;
      b[i] = 0.5F * static_cast<float>(i % 3);
      want += double{a[i]} * b[i];
    }
    EXPECT_FLOAT_EQ(dot(a.data(), b.data(), n), static_cast<float>(want)) << n;
  }
}

TEST(model, incremental_logits_match_a_from_scratch_reference) {
  auto c = one_layer();
  auto w = loud_weights(c, 11);
  std::vector<int32_t> tokens{256, 'H', 'e', 'l', 'l', 'o', ',', ' ', 'w', 0, 255, 257};
  sequence seq(c);
  sequence* batch[] = {&seq};
  for (size_t t = 0; t < tokens.size(); ++t) {
    int32_t feed[] = {tokens[t]};
    auto logits = step(*w, batch, feed);
    ASSERT_TRUE(logits) << logits.error().message;
    std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(t + 1));
    expect_close((*logits)[0], reference_logits(*w, prefix), 1e-4);
  }
  EXPECT_EQ(seq.position, tokens.size());
}

TEST(model, two_layer_tiny_matches_reference_too) {
  auto c = *preset("tiny");
  auto w = loud_weights(c, 12);
  std::vector<int32_t> tokens{256, 'a', 'b', 'c', 'd', 'e', 'f'};
  sequence seq(c);
  sequence* batch[] = {&seq};
  std::vector<float> last;
  for (int32_t t : tokens) {
    int32_t feed[] = {t};
    auto logits = step(*w, batch, feed);
    ASSERT_TRUE(logits);
    last = (*logits)[0];
  }
  expect_close(last, reference_logits(*w, tokens), 1e-4);
}

TEST(model, generating_with_the_kv_cache_equals_recomputing_from_scratch) {
  auto c = *preset("tiny");
  auto w = loud_weights(c, 13);
  std::vector<int32_t> tokens{256, 'k', 'v'};
  sequence seq(c);
  sequence* batch[] = {&seq};
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t feed[] = {tokens[i]};
    auto logits = step(*w, batch, feed);
    ASSERT_TRUE(logits);
    if (i + 1 < tokens.size()) {
      continue;
    }
    std::vector<float>& l = (*logits)[0];
    expect_close(l, reference_logits(*w, tokens), 1e-4);
    if (tokens.size() < 20) {
      auto next = std::max_element(l.begin(), l.end()) - l.begin();
      tokens.push_back(static_cast<int32_t>(next));
    }
  }
  EXPECT_EQ(tokens.size(), 20u);
  EXPECT_EQ(seq.position, 20u);
}

std::vector<std::vector<float>> run_alone(const weights& w, const std::vector<int32_t>& tokens) {
  sequence seq(w.config);
  sequence* batch[] = {&seq};
  std::vector<std::vector<float>> out;
  for (int32_t t : tokens) {
    int32_t feed[] = {t};
    out.push_back((*step(w, batch, feed))[0]);
  }
  return out;
}

TEST(model, logits_are_batch_invariant) {
  for (const char* name : {"tiny", "small", "moe-tiny"}) {
    auto c = *preset(name);
    auto w = make_weights(c, 21);
    std::vector<int32_t> a_tokens{256, 'b', 'a', 't', 'c', 'h'};
    auto alone = run_alone(*w, a_tokens);

    sequence a(c);
    sequence b(c);
    sequence d(c);
    // B and D start ahead, at different positions.
    for (int32_t t : std::initializer_list<int32_t>{256, 'x', 'y'}) {
      sequence* one[] = {&b};
      int32_t feed[] = {t};
      ASSERT_TRUE(step(*w, one, feed));
    }
    for (int32_t t : std::initializer_list<int32_t>{256, 'q', 'r', 's', 't', 'u', 'v'}) {
      sequence* one[] = {&d};
      int32_t feed[] = {t};
      ASSERT_TRUE(step(*w, one, feed));
    }
    for (size_t i = 0; i < a_tokens.size(); ++i) {
      std::vector<sequence*> batch;
      std::vector<int32_t> feed;
      // Vary the batch: A alone, A with B, A between B and D.
      if (i % 3 == 1) {
        batch = {&b, &a};
        feed = {'z', a_tokens[i]};
      } else if (i % 3 == 2) {
        batch = {&b, &a, &d};
        feed = {'m', a_tokens[i], 'n'};
      } else {
        batch = {&a, &d};
        feed = {a_tokens[i], 'o'};
      }
      auto logits = step(*w, batch, feed);
      ASSERT_TRUE(logits);
      size_t at = i % 3 == 0 ? 0 : 1;
      ASSERT_EQ((*logits)[at].size(), alone[i].size());
      EXPECT_EQ(std::memcmp((*logits)[at].data(), alone[i].data(), alone[i].size() * 4), 0)
        << name << " token " << i;
    }
  }
}

TEST(model, bf16_weights_give_finite_logits) {
  auto c = *preset("tiny");
  c.torch_dtype = weight_dtype::bfloat16;
  auto w = make_weights(c, 4);
  auto logits = run_alone(*w, {256, 'o', 'k'});
  for (const auto& l : logits) {
    ASSERT_EQ(l.size(), 258u);
    for (float v : l) {
      ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST(model, bad_steps_are_refused_and_touch_nothing) {
  auto c = *preset("tiny");
  c.max_position_embeddings = 2;
  auto w = make_weights(c, 1);
  sequence a(c);
  sequence b(c);
  {
    sequence* batch[] = {&a, &b};
    int32_t feed[] = {1};
    EXPECT_FALSE(step(*w, batch, feed));
  }
  {
    sequence* batch[] = {&a, &b};
    int32_t feed[] = {1, 258};
    EXPECT_FALSE(step(*w, batch, feed));
  }
  {
    sequence* batch[] = {&a, &a};
    int32_t feed[] = {1, 2};
    EXPECT_FALSE(step(*w, batch, feed));
  }
  EXPECT_EQ(a.position, 0u);
  EXPECT_TRUE(a.keys[0].empty());
  sequence* batch[] = {&a};
  int32_t feed[] = {1};
  ASSERT_TRUE(step(*w, batch, feed));
  ASSERT_TRUE(step(*w, batch, feed));
  auto full = step(*w, batch, feed);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, errc::limit_exceeded);
  sequence wrong(one_layer());
  sequence* other[] = {&wrong};
  EXPECT_FALSE(step(*w, other, feed));
}

} // namespace
} // namespace stitch::engine

namespace stitch::engine {
namespace {

// One step of `tokens[t]` at a time through `seq`: every position's logits.
std::vector<std::vector<float>> feed_all(const weights& w, sequence& seq,
                                         const std::vector<int32_t>& tokens) {
  std::vector<std::vector<float>> out;
  sequence* batch[] = {&seq};
  for (int32_t t : tokens) {
    int32_t feed[] = {t};
    auto logits = step(w, batch, feed);
    EXPECT_TRUE(logits) << logits.error().message;
    if (!logits)
      return out;
    out.push_back((*logits)[0]);
  }
  return out;
}

TEST(model, top_k_is_descending_with_the_lowest_id_first_on_ties) {
  const float scores[] = {0.1F, 0.7F, 0.3F, 0.7F, 0.05F};
  int32_t out[3];
  top_k(scores, 5, 3, out);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  EXPECT_EQ(out[2], 2);
}

TEST(model, a_mixture_of_experts_matches_a_from_scratch_reference_and_records_its_routing) {
  auto c = *preset("moe-tiny");
  ASSERT_TRUE(c.is_moe());
  auto w = loud_weights(c, 31);
  std::vector<int32_t> tokens{256, 'M', 'o', 'E', ' ', 'r', 'o', 'u', 't', 'e', 's', 257};
  sequence seq(c);
  auto logits = feed_all(*w, seq, tokens);
  ASSERT_EQ(logits.size(), tokens.size());
  std::vector<int32_t> want_routing;
  for (size_t t = 0; t < tokens.size(); ++t) {
    std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(t + 1));
    expect_close(logits[t], reference_logits(*w, prefix, &want_routing), 1e-4);
  }
  const size_t per_position = size_t{c.num_hidden_layers} * c.num_experts_per_tok;
  ASSERT_EQ(seq.routed_experts.size(), tokens.size() * per_position);
  EXPECT_EQ(seq.routed_experts, want_routing);
  // The loud router spreads the tokens over several experts.
  std::vector<int32_t> used(seq.routed_experts);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  EXPECT_GE(used.size(), 4u);
  EXPECT_EQ(seq.replay_disagreements, 0u);
}

TEST(model, replaying_its_own_routing_changes_nothing_and_other_routing_changes_the_logits) {
  auto c = *preset("moe-tiny");
  auto w = loud_weights(c, 32);
  std::vector<int32_t> tokens{256, 'r', 'e', 'p', 'l', 'a', 'y'};
  sequence own(c);
  auto own_logits = feed_all(*w, own, tokens);

  sequence same(c);
  same.replay_experts = own.routed_experts;
  auto same_logits = feed_all(*w, same, tokens);
  ASSERT_EQ(same_logits.size(), own_logits.size());
  for (size_t t = 0; t < tokens.size(); ++t)
    EXPECT_EQ(std::memcmp(same_logits[t].data(), own_logits[t].data(), own_logits[t].size() * 4), 0)
      << "position " << t;
  EXPECT_EQ(same.routed_experts, own.routed_experts);
  EXPECT_EQ(same.replay_disagreements, 0u);

  // Route the last position's last layer to two other experts.
  auto other = own.routed_experts;
  const size_t k = c.num_experts_per_tok;
  const size_t at = ((tokens.size() - 1) * c.num_hidden_layers + c.num_hidden_layers - 1) * k;
  std::vector<int32_t> fresh;
  for (int32_t e = 0; e < static_cast<int32_t>(c.num_experts) && fresh.size() < k; ++e)
    if (std::find(other.begin() + static_cast<ptrdiff_t>(at),
                  other.begin() + static_cast<ptrdiff_t>(at + k), e)
        == other.begin() + static_cast<ptrdiff_t>(at + k))
      fresh.push_back(e);
  std::copy(fresh.begin(), fresh.end(), other.begin() + static_cast<ptrdiff_t>(at));
  sequence replayed(c);
  replayed.replay_experts = other;
  auto replayed_logits = feed_all(*w, replayed, tokens);
  ASSERT_EQ(replayed_logits.size(), tokens.size());
  for (size_t t = 0; t + 1 < tokens.size(); ++t)
    EXPECT_EQ(replayed_logits[t], own_logits[t]) << "position " << t;
  double moved = 0;
  for (size_t i = 0; i < own_logits.back().size(); ++i)
    moved = std::max(moved, double{std::abs(replayed_logits.back()[i] - own_logits.back()[i])});
  EXPECT_GT(moved, 1e-3);
  EXPECT_EQ(replayed.routed_experts, other);
  EXPECT_EQ(replayed.replay_disagreements, 1u);
}

TEST(model, a_bad_routing_replay_is_refused_naming_the_problem) {
  auto c = *preset("moe-tiny");
  auto w = make_weights(c, 33);
  const size_t per_position = size_t{c.num_hidden_layers} * c.num_experts_per_tok;
  auto refused = [&](std::vector<int32_t> replay, const std::string& says) {
    sequence seq(c);
    seq.replay_experts = std::move(replay);
    sequence* batch[] = {&seq};
    int32_t feed[] = {256};
    auto r = step(*w, batch, feed);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
    EXPECT_EQ(seq.position, 0u);
    EXPECT_TRUE(seq.routed_experts.empty());
  };
  refused(std::vector<int32_t>(per_position - 1, 0), "covers 0 positions");
  std::vector<int32_t> outside(per_position, 1);
  for (size_t i = 0; i < outside.size(); i += 2)
    outside[i] = 0;
  outside[1] = static_cast<int32_t>(c.num_experts);
  refused(outside, "names expert 8");
  refused(std::vector<int32_t>(per_position, 3), "twice");
  // A dense model has nothing to replay.
  auto dense = *preset("tiny");
  auto dw = make_weights(dense, 34);
  sequence seq(dense);
  seq.replay_experts = {0, 1};
  sequence* batch[] = {&seq};
  int32_t feed[] = {256};
  auto r = step(*dw, batch, feed);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("no experts"), std::string::npos);
}

TEST(model, the_last_layers_trace_holds_what_the_router_and_experts_did) {
  auto c = *preset("moe-tiny");
  auto w = loud_weights(c, 35);
  sequence seq(c);
  sequence* batch[] = {&seq};
  int32_t feed[] = {256};
  std::vector<moe_trace> trace;
  step_logits hidden;
  ASSERT_TRUE(step(*w, batch, feed, gpu::shared_pool(), &hidden, &trace));
  ASSERT_EQ(trace.size(), 1u);
  const auto& t = trace[0];
  const size_t h = c.hidden_size;
  const size_t k = c.num_experts_per_tok;
  ASSERT_EQ(t.router_logits.size(), c.num_experts);
  ASSERT_EQ(t.experts.size(), k);
  ASSERT_EQ(t.expert_outputs.size(), k * h);
  ASSERT_EQ(t.residual.size(), h);
  // The last layer's routing is the sequence's record.
  const size_t at = size_t{c.num_hidden_layers - 1} * k;
  EXPECT_TRUE(std::equal(t.experts.begin(), t.experts.end(),
                         seq.routed_experts.begin() + static_cast<ptrdiff_t>(at)));
  // The final normalized hidden state is the norm of the residual.
  std::vector<float> normed(h);
  rms_norm(t.residual.data(), w->norm.data(), h, c.rms_norm_eps, normed.data());
  EXPECT_EQ(normed, hidden[0]);
}

} // namespace
} // namespace stitch::engine
