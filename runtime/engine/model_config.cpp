#include "runtime/engine/model_config.hpp"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace stitch::engine {

namespace {

using json = nlohmann::json;

constexpr uint32_t max_hidden = 32768;
constexpr uint32_t max_intermediate = 131072;
constexpr uint32_t max_layers = 512;
constexpr uint32_t max_heads = 512;
constexpr uint32_t max_head_dim = 1024;
constexpr uint32_t max_vocab = 1u << 20;
constexpr uint32_t max_positions = 1u << 20;
constexpr uint32_t max_experts = 1024;

error bad_field(std::string_view field, const std::string& why) {
  return make_error(errc::invalid_argument, "model config: " + std::string(field) + " " + why);
}

status check_range(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return bad_field(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi)
                              + "], got " + std::to_string(value));
  }
  return {};
}

result<uint32_t> read_uint(const json& doc, std::string_view field, uint32_t lo, uint32_t hi) {
  auto it = doc.find(field);
  if (it == doc.end()) {
    return bad_field(field, "is missing");
  }
  if (!it->is_number_integer()) {
    return bad_field(field, "must be an integer");
  }
  if (it->is_number_unsigned()) {
    uint64_t value = it->get<uint64_t>();
    if (auto ok = check_range(field, value, lo, hi); !ok) {
      return std::move(ok).error();
    }
    return static_cast<uint32_t>(value);
  }
  return bad_field(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi)
                            + "], got " + std::to_string(it->get<int64_t>()));
}

struct uint_field {
  std::string_view name;
  uint32_t* target;
  uint32_t hi;
};

/// Each field, at least 1 and at most its `hi`, into its target.
status read_uints(const json& doc, std::initializer_list<uint_field> fields) {
  for (const auto& f : fields) {
    auto value = read_uint(doc, f.name, 1, f.hi);
    if (!value) {
      return std::move(value).error();
    }
    *f.target = *value;
  }
  return {};
}

result<double> read_double(const json& doc, std::string_view field) {
  auto it = doc.find(field);
  if (it == doc.end()) {
    return bad_field(field, "is missing");
  }
  if (!it->is_number()) {
    return bad_field(field, "must be a number");
  }
  return it->get<double>();
}

/// The Qwen3-MoE fields of `doc` into `c`, refusing the variants the engine
/// does not implement rather than serving them wrong.
status parse_moe_fields(const json& doc, model_config& c) {
  if (auto ok =
        read_uints(doc, {{"num_experts", &c.num_experts, max_experts},
                         {"num_experts_per_tok", &c.num_experts_per_tok, max_experts},
                         {"moe_intermediate_size", &c.moe_intermediate_size, max_intermediate}});
      !ok) {
    return ok;
  }
  if (auto norm = doc.find("norm_topk_prob"); norm != doc.end()) {
    if (!norm->is_boolean()) {
      return bad_field("norm_topk_prob", "must be a boolean");
    }
    c.norm_topk_prob = norm->get<bool>();
  }
  if (auto step = doc.find("decoder_sparse_step");
      step != doc.end() && !(step->is_number_integer() && *step == 1)) {
    return bad_field("decoder_sparse_step", "must be 1 (every layer a mixture of experts)");
  }
  if (auto dense = doc.find("mlp_only_layers");
      dense != doc.end() && !(dense->is_array() && dense->empty()) && !dense->is_null()) {
    return bad_field("mlp_only_layers", "must be empty (every layer a mixture of experts)");
  }
  if (auto bias = doc.find("attention_bias");
      bias != doc.end() && !(bias->is_boolean() && !bias->get<bool>())) {
    return bad_field("attention_bias", "must be false");
  }
  if (auto hd = doc.find("head_dim"); hd != doc.end() && !hd->is_null()) {
    const uint64_t heads = c.num_attention_heads == 0 ? 1 : c.num_attention_heads;
    if (!hd->is_number_unsigned() || hd->get<uint64_t>() * heads != c.hidden_size) {
      return bad_field("head_dim", "must be hidden_size / num_attention_heads");
    }
  }
  return {};
}

} // namespace

std::string_view to_string(weight_dtype type) noexcept {
  return type == weight_dtype::bfloat16 ? "bfloat16" : "float32";
}

std::string_view to_string(architecture arch) noexcept {
  return arch == architecture::qwen3_moe ? "qwen3_moe" : "llama";
}

uint64_t model_config::parameter_count() const noexcept {
  uint64_t h = hidden_size;
  uint64_t attention = h * h                          // q_proj
                       + 2 * uint64_t{kv_width()} * h // k_proj, v_proj
                       + h * h                        // o_proj
                       + 2 * h;                       // the two norms
  uint64_t mlp = 3 * h * intermediate_size;           // gate, up, down
  if (is_moe()) {
    mlp = uint64_t{num_experts} * h                               // the router
          + uint64_t{num_experts} * 3 * h * moe_intermediate_size // the experts
          + 2 * uint64_t{head_dim()};                             // q_norm, k_norm
  }
  return num_hidden_layers * (attention + mlp) + 2 * uint64_t{vocab_size} * h + h;
}

status validate(const model_config& c) {
  if (auto ok = check_range("hidden_size", c.hidden_size, 2, max_hidden); !ok) {
    return ok;
  }
  if (auto ok = check_range("intermediate_size", c.intermediate_size, 1, max_intermediate); !ok) {
    return ok;
  }
  if (auto ok = check_range("num_hidden_layers", c.num_hidden_layers, 1, max_layers); !ok) {
    return ok;
  }
  if (auto ok = check_range("num_attention_heads", c.num_attention_heads, 1, max_heads); !ok) {
    return ok;
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return bad_field("num_attention_heads",
                     "must divide hidden_size " + std::to_string(c.hidden_size));
  }
  uint32_t head_dim = c.head_dim();
  if (head_dim % 2 != 0 || head_dim > max_head_dim) {
    return bad_field("num_attention_heads", "gives head dimension " + std::to_string(head_dim)
                                              + "; it must be even and at most "
                                              + std::to_string(max_head_dim));
  }
  if (auto ok = check_range("num_key_value_heads", c.num_key_value_heads, 1, c.num_attention_heads);
      !ok) {
    return ok;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad_field("num_key_value_heads",
                     "must divide num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  if (auto ok = check_range("vocab_size", c.vocab_size, 1, max_vocab); !ok) {
    return ok;
  }
  if (auto ok = check_range("max_position_embeddings", c.max_position_embeddings, 1, max_positions);
      !ok) {
    return ok;
  }
  if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0.0 || c.rms_norm_eps >= 1.0) {
    return bad_field("rms_norm_eps", "must be in (0, 1)");
  }
  if (!std::isfinite(c.rope_theta) || c.rope_theta < 1.0 || c.rope_theta > 1e9) {
    return bad_field("rope_theta", "must be in [1, 1e9]");
  }
  if (c.tie_word_embeddings) {
    return bad_field("tie_word_embeddings", "must be false (lm_head.weight is its own tensor)");
  }
  if (c.is_moe()) {
    if (auto ok = check_range("num_experts", c.num_experts, 1, max_experts); !ok) {
      return ok;
    }
    if (auto ok = check_range("num_experts_per_tok", c.num_experts_per_tok, 1, c.num_experts);
        !ok) {
      return ok;
    }
    if (auto ok =
          check_range("moe_intermediate_size", c.moe_intermediate_size, 1, max_intermediate);
        !ok) {
      return ok;
    }
  } else if (c.num_experts != 0 || c.num_experts_per_tok != 0 || c.moe_intermediate_size != 0
             || c.norm_topk_prob) {
    return bad_field("num_experts", "is for model_type \"qwen3_moe\"; a llama model has none");
  }
  if (c.parameter_count() > max_parameter_count) {
    return make_error(errc::limit_exceeded, "model config: " + std::to_string(c.parameter_count())
                                              + " parameters exceed the limit of "
                                              + std::to_string(max_parameter_count));
  }
  return {};
}

result<model_config> parse_model_config(std::string_view json_text) {
  json doc = json::parse(json_text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(errc::invalid_argument, "model config: not a JSON object");
  }
  model_config c;
  if (auto type = doc.find("model_type"); type != doc.end()) {
    if (type->is_string() && *type == "llama") {
      c.arch = architecture::llama;
    } else if (type->is_string() && *type == "qwen3_moe") {
      c.arch = architecture::qwen3_moe;
    } else {
      return bad_field("model_type", "must be \"llama\" or \"qwen3_moe\"");
    }
  }
  if (auto act = doc.find("hidden_act");
      act != doc.end() && (!act->is_string() || act->get<std::string>() != "silu")) {
    return bad_field("hidden_act", "must be \"silu\"");
  }
  if (auto ok =
        read_uints(doc, {{"hidden_size", &c.hidden_size, max_hidden},
                         {"intermediate_size", &c.intermediate_size, max_intermediate},
                         {"num_hidden_layers", &c.num_hidden_layers, max_layers},
                         {"num_attention_heads", &c.num_attention_heads, max_heads},
                         {"num_key_value_heads", &c.num_key_value_heads, max_heads},
                         {"vocab_size", &c.vocab_size, max_vocab},
                         {"max_position_embeddings", &c.max_position_embeddings, max_positions}});
      !ok) {
    return std::move(ok).error();
  }
  auto eps = read_double(doc, "rms_norm_eps");
  if (!eps) {
    return std::move(eps).error();
  }
  c.rms_norm_eps = *eps;
  auto theta = read_double(doc, "rope_theta");
  if (!theta) {
    return std::move(theta).error();
  }
  c.rope_theta = *theta;
  auto dtype = doc.find("torch_dtype");
  if (dtype == doc.end() || !dtype->is_string()) {
    return bad_field("torch_dtype", "must be \"float32\" or \"bfloat16\"");
  }
  if (*dtype == "float32") {
    c.torch_dtype = weight_dtype::float32;
  } else if (*dtype == "bfloat16") {
    c.torch_dtype = weight_dtype::bfloat16;
  } else {
    return bad_field("torch_dtype", "must be \"float32\" or \"bfloat16\", got "
                                      + quote_untrusted(dtype->get<std::string>()));
  }
  if (auto tie = doc.find("tie_word_embeddings"); tie != doc.end()) {
    if (!tie->is_boolean()) {
      return bad_field("tie_word_embeddings", "must be a boolean");
    }
    c.tie_word_embeddings = tie->get<bool>();
  }
  if (c.is_moe()) {
    if (auto ok = parse_moe_fields(doc, c); !ok) {
      return std::move(ok).error();
    }
  }
  if (auto ok = validate(c); !ok) {
    return std::move(ok).error();
  }
  return c;
}

std::string render_model_config(const model_config& c) {
  nlohmann::ordered_json doc;
  doc["architectures"] = {c.is_moe() ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM"};
  doc["model_type"] = to_string(c.arch);
  doc["hidden_act"] = "silu";
  doc["hidden_size"] = c.hidden_size;
  doc["intermediate_size"] = c.intermediate_size;
  doc["num_hidden_layers"] = c.num_hidden_layers;
  doc["num_attention_heads"] = c.num_attention_heads;
  doc["num_key_value_heads"] = c.num_key_value_heads;
  doc["vocab_size"] = c.vocab_size;
  doc["max_position_embeddings"] = c.max_position_embeddings;
  doc["rms_norm_eps"] = c.rms_norm_eps;
  doc["rope_theta"] = c.rope_theta;
  doc["torch_dtype"] = to_string(c.torch_dtype);
  doc["tie_word_embeddings"] = c.tie_word_embeddings;
  doc["attention_bias"] = false;
  if (c.is_moe()) {
    doc["head_dim"] = c.head_dim();
    doc["num_experts"] = c.num_experts;
    doc["num_experts_per_tok"] = c.num_experts_per_tok;
    doc["moe_intermediate_size"] = c.moe_intermediate_size;
    doc["norm_topk_prob"] = c.norm_topk_prob;
    doc["decoder_sparse_step"] = 1;
    doc["mlp_only_layers"] = nlohmann::ordered_json::array();
    doc["output_router_logits"] = false;
    doc["use_sliding_window"] = false;
  } else {
    doc["mlp_bias"] = false;
  }
  doc["bos_token_id"] = 256;
  doc["eos_token_id"] = 257;
  return doc.dump(2);
}

result<model_config> preset(std::string_view name) {
  model_config c;
  c.vocab_size = 258;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  if (name == "tiny") {
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 512;
    c.torch_dtype = weight_dtype::float32;
  } else if (name == "small") {
    c.hidden_size = 512;
    c.intermediate_size = 1376;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 2048;
    c.torch_dtype = weight_dtype::float32;
  } else if (name == "medium") {
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.num_hidden_layers = 10;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 4096;
    c.torch_dtype = weight_dtype::bfloat16;
  } else if (name == "moe-tiny" || name == "moe-small") {
    const bool tiny = name == "moe-tiny";
    c.arch = architecture::qwen3_moe;
    c.hidden_size = tiny ? 64 : 512;
    c.intermediate_size = tiny ? 128 : 1376;
    c.num_hidden_layers = tiny ? 2 : 4;
    c.num_attention_heads = tiny ? 4 : 8;
    c.num_key_value_heads = tiny ? 2 : 4;
    c.max_position_embeddings = tiny ? 512 : 2048;
    c.num_experts = tiny ? 8 : 16;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = tiny ? 32 : 128;
    c.norm_topk_prob = true;
    c.torch_dtype = weight_dtype::float32;
  } else {
    return make_error(errc::invalid_argument,
                      "unknown model preset " + quote_untrusted(name)
                        + " (expected tiny, small, medium, moe-tiny or moe-small)");
  }
  return c;
}

} // namespace stitch::engine
