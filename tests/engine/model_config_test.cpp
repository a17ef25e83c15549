#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/engine/model_config.hpp"

namespace stitch::engine {
namespace {

using json = nlohmann::json;

json tiny_json() {
  return json::parse(render_model_config(*preset("tiny")));
}

std::string refusal(const json& doc) {
  auto parsed = parse_model_config(doc.dump());
  EXPECT_FALSE(parsed) << doc.dump();
  return parsed ? std::string() : parsed.error().message;
}

TEST(model_config, presets_validate_and_have_their_sizes) {
  for (auto name : {"tiny", "small", "medium", "moe-tiny", "moe-small"}) {
    auto c = preset(name);
    ASSERT_TRUE(c) << name;
    EXPECT_TRUE(validate(*c)) << name;
  }
  EXPECT_LT(preset("tiny")->parameter_count() * 4, uint64_t{2} << 20);
  uint64_t small_bytes = preset("small")->parameter_count() * 4;
  EXPECT_GT(small_bytes, uint64_t{30} << 20);
  EXPECT_LT(small_bytes, uint64_t{60} << 20);
  auto medium = *preset("medium");
  EXPECT_EQ(medium.torch_dtype, weight_dtype::bfloat16);
  uint64_t medium_bytes = medium.parameter_count() * 2;
  EXPECT_GT(medium_bytes, uint64_t{700} << 20);
  EXPECT_LT(medium_bytes, uint64_t{1300} << 20);
  auto unknown = preset("huge");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("huge"), std::string::npos);
}

TEST(model_config, render_parse_round_trip) {
  for (auto name : {"tiny", "small", "medium", "moe-tiny", "moe-small"}) {
    auto c = *preset(name);
    auto back = parse_model_config(render_model_config(c));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, c);
  }
  auto doc = tiny_json();
  EXPECT_EQ(doc["model_type"], "llama");
  EXPECT_EQ(doc["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(doc["torch_dtype"], "float32");
}

TEST(model_config, every_field_is_required) {
  for (auto field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                     "rope_theta", "torch_dtype"}) {
    auto doc = tiny_json();
    doc.erase(field);
    EXPECT_NE(refusal(doc).find(field), std::string::npos) << field;
  }
}

TEST(model_config, hostile_values_are_refused_naming_the_field) {
  struct bad {
    const char* field;
    json value;
  };
  const bad cases[] = {
    {"hidden_size", uint64_t{1} << 40},
    {"hidden_size", -64},
    {"hidden_size", 64.5},
    {"hidden_size", "64"},
    {"hidden_size", 0},
    {"intermediate_size", 1u << 30},
    {"num_hidden_layers", 100000},
    {"num_attention_heads", 0},
    {"num_attention_heads", 3},
    {"num_key_value_heads", 3},
    {"num_key_value_heads", 8},
    {"vocab_size", uint64_t{1} << 33},
    {"max_position_embeddings", uint64_t{1} << 40},
    {"rms_norm_eps", 0.0},
    {"rms_norm_eps", -1.0},
    {"rms_norm_eps", "tiny"},
    {"rope_theta", 0.0},
    {"rope_theta", 1e300},
    {"torch_dtype", "float16"},
    {"torch_dtype", 32},
    {"tie_word_embeddings", true},
    {"tie_word_embeddings", "no"},
    {"model_type", "gpt2"},
    {"hidden_act", "gelu"},
  };
  for (const auto& c : cases) {
    auto doc = tiny_json();
    doc[c.field] = c.value;
    EXPECT_NE(refusal(doc).find(c.field), std::string::npos) << c.field << " = " << c.value;
  }
}

TEST(model_config, models_too_large_to_allocate_are_refused) {
  auto doc = tiny_json();
  doc["hidden_size"] = 32768;
  doc["num_attention_heads"] = 256;
  doc["num_key_value_heads"] = 256;
  doc["intermediate_size"] = 131072;
  doc["num_hidden_layers"] = 512;
  auto parsed = parse_model_config(doc.dump());
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().code, errc::limit_exceeded);
}

TEST(model_config, malformed_json_is_refused) {
  EXPECT_FALSE(parse_model_config("{"));
  EXPECT_FALSE(parse_model_config("[1, 2]"));
  EXPECT_FALSE(parse_model_config(""));
}

} // namespace
} // namespace stitch::engine

namespace stitch::engine {
namespace {

json moe_json() {
  return json::parse(render_model_config(*preset("moe-tiny")));
}

TEST(model_config, a_qwen3_moe_config_says_what_hugging_face_reads) {
  auto c = *preset("moe-tiny");
  EXPECT_TRUE(c.is_moe());
  auto doc = moe_json();
  EXPECT_EQ(doc["model_type"], "qwen3_moe");
  EXPECT_EQ(doc["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(doc["num_experts"], 8);
  EXPECT_EQ(doc["num_experts_per_tok"], 2);
  EXPECT_EQ(doc["moe_intermediate_size"], 32);
  EXPECT_EQ(doc["norm_topk_prob"], true);
  EXPECT_EQ(doc["head_dim"], 16);
  EXPECT_EQ(doc["decoder_sparse_step"], 1);
  // Router, experts and the per-head norms count.
  uint64_t h = c.hidden_size;
  uint64_t per_layer =
    h * h * 2 + 2 * uint64_t{c.kv_width()} * h + 2 * h + 8 * h + 8 * 3 * h * 32 + 2 * 16;
  EXPECT_EQ(c.parameter_count(), 2 * per_layer + 2 * 258 * h + h);
  auto small = *preset("moe-small");
  EXPECT_GT(small.parameter_count() * 4, uint64_t{40} << 20);
  EXPECT_LT(small.parameter_count() * 4, uint64_t{100} << 20);
}

TEST(model_config, qwen3_moe_variants_the_engine_cannot_serve_are_refused_by_name) {
  const std::vector<std::pair<std::string, json>> cases = {
    {"num_experts", json()},
    {"num_experts_per_tok", json(9)},
    {"moe_intermediate_size", json(0)},
    {"mlp_only_layers", json::array({1})},
    {"decoder_sparse_step", json(2)},
    {"head_dim", json(32)},
    {"attention_bias", json(true)},
    {"norm_topk_prob", json("yes")},
    {"model_type", json("mixtral")},
  };
  for (const auto& [field, value] : cases) {
    auto doc = moe_json();
    if (value.is_null())
      doc.erase(field);
    else
      doc[field] = value;
    auto got = parse_model_config(doc.dump());
    ASSERT_FALSE(got) << field;
    EXPECT_NE(got.error().message.find(field), std::string::npos) << got.error().message;
  }
  // A llama config with experts is not a mixture.
  auto dense = *preset("tiny");
  dense.num_experts = 4;
  EXPECT_FALSE(validate(dense));
}

} // namespace
} // namespace stitch::engine
