#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "runtime/engine/weights.hpp"

namespace stitch::engine {
namespace {

model_config tiny() {
  return *preset("tiny");
}

TEST(weights, names_and_shapes_are_the_hugging_face_ones) {
  auto c = tiny();
  auto set = random_init(c, 1);
  ASSERT_TRUE(set);
  std::map<std::string, std::vector<uint64_t>> want{
    {"model.embed_tokens.weight", {258, 64}},
    {"model.norm.weight", {64}},
    {"lm_head.weight", {258, 64}},
  };
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "self_attn.q_proj.weight"] = {64, 64};
    want[p + "self_attn.k_proj.weight"] = {32, 64};
    want[p + "self_attn.v_proj.weight"] = {32, 64};
    want[p + "self_attn.o_proj.weight"] = {64, 64};
    want[p + "mlp.gate_proj.weight"] = {128, 64};
    want[p + "mlp.up_proj.weight"] = {128, 64};
    want[p + "mlp.down_proj.weight"] = {64, 128};
    want[p + "input_layernorm.weight"] = {64};
    want[p + "post_attention_layernorm.weight"] = {64};
  }
  ASSERT_EQ(set->size(), want.size());
  for (const auto& [name, shape] : want) {
    auto it = set->find(name);
    ASSERT_NE(it, set->end()) << name;
    EXPECT_EQ(it->second.name, name);
    EXPECT_EQ(it->second.shape, shape) << name;
    EXPECT_EQ(it->second.type, safetensors::dtype::f32) << name;
  }
  uint64_t elements = 0;
  for (const auto& [name, t] : *set) {
    elements += t.bytes.size() / 4;
  }
  EXPECT_EQ(elements, c.parameter_count());
}

TEST(weights, random_init_is_deterministic_per_seed) {
  auto c = tiny();
  auto a = random_init(c, 7);
  auto b = random_init(c, 7);
  auto other = random_init(c, 8);
  ASSERT_TRUE(a && b && other);
  EXPECT_EQ(*a, *b);
  const auto& qa = a->at("model.layers.0.self_attn.q_proj.weight").bytes;
  const auto& qo = other->at("model.layers.0.self_attn.q_proj.weight").bytes;
  EXPECT_NE(qa, qo);
  // Norms are ones whatever the seed.
  EXPECT_EQ(a->at("model.norm.weight"), other->at("model.norm.weight"));
  float first;
  std::memcpy(&first, a->at("model.norm.weight").bytes.data(), 4);
  EXPECT_EQ(first, 1.0F);
}

TEST(weights, random_values_look_like_scaled_normals) {
  auto set = *random_init(tiny(), 3);
  const auto& t = set.at("model.layers.1.mlp.up_proj.weight");
  size_t n = t.bytes.size() / 4;
  std::vector<float> v(n);
  std::memcpy(v.data(), t.bytes.data(), n * 4);
  double sum = 0;
  double squares = 0;
  for (float x : v) {
    sum += x;
    squares += double{x} * x;
  }
  double mean = sum / static_cast<double>(n);
  double stddev = std::sqrt(squares / static_cast<double>(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(stddev, 0.02, 0.002);
}

TEST(weights, bf16_init_and_build) {
  auto c = tiny();
  c.torch_dtype = weight_dtype::bfloat16;
  auto set = random_init(c, 5);
  ASSERT_TRUE(set);
  const auto& embed = set->at("model.embed_tokens.weight");
  EXPECT_EQ(embed.type, safetensors::dtype::bf16);
  EXPECT_EQ(embed.bytes.size(), 258u * 64 * 2);
  auto w = build_weights(c, *set);
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ((*w)->norm[0], 1.0F);
  EXPECT_EQ((*w)->embed_tokens.data.size(), 258u * 64);
}

TEST(weights, build_keeps_the_values) {
  auto c = tiny();
  auto set = *random_init(c, 9);
  auto w = build_weights(c, set);
  ASSERT_TRUE(w) << w.error().message;
  const auto& down = set.at("model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(
    std::memcmp((*w)->layers[1].down_proj.data.data(), down.bytes.data(), down.bytes.size()), 0);
  EXPECT_EQ((*w)->layers[1].down_proj.rows, 64u);
  EXPECT_EQ((*w)->layers[1].down_proj.cols, 128u);
}

void expect_refused(const model_config& c, const pipeline::tensor_set& set, std::string_view name) {
  auto w = build_weights(c, set);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::invalid_argument);
  EXPECT_NE(w.error().message.find(name), std::string::npos) << w.error().message;
}

TEST(weights, build_refuses_bad_tensors_naming_them) {
  auto c = tiny();
  const auto good = *random_init(c, 1);
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  {
    auto set = good;
    set.at(k).shape = {64, 32};
    expect_refused(c, set, k);
  }
  {
    auto set = good;
    set.erase(k);
    expect_refused(c, set, k);
  }
  {
    auto set = good;
    set.at(k).type = safetensors::dtype::f16;
    expect_refused(c, set, k);
  }
  {
    auto set = good;
    set.at(k).bytes.resize(10);
    expect_refused(c, set, k);
  }
  {
    auto set = good;
    std::string extra = "model.layers.0.self_attn.rotary_emb.inv_freq";
    set[extra] =
      pipeline::host_tensor{extra, safetensors::dtype::f32, {8}, std::vector<std::byte>(32)};
    expect_refused(c, set, extra);
  }
  {
    auto other = c;
    other.num_hidden_layers = 3;
    expect_refused(other, good, "model.layers.2.");
  }
}

} // namespace
} // namespace stitch::engine
