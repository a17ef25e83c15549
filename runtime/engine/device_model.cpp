#include "runtime/engine/device_model.hpp"

#include <cstdio>
#include <string>

#include "runtime/engine/weights.hpp"

namespace stitch::engine {

namespace {

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1ULL << 30));
  return text;
}

} // namespace

result<gpu::llama_shape> llama_shape_of(const model_config& c) {
  if (c.is_moe())
    return make_error(errc::invalid_argument,
                      "the CUDA forward pass serves dense llama checkpoints; a qwen3_moe "
                      "checkpoint needs engine.device = cpu");
  gpu::llama_shape s;
  s.hidden = c.hidden_size;
  s.intermediate = c.intermediate_size;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.vocab = c.vocab_size;
  s.max_positions = c.max_position_embeddings;
  s.rms_norm_eps = c.rms_norm_eps;
  s.rope_theta = c.rope_theta;
  s.bf16 = c.torch_dtype == weight_dtype::bfloat16;
  if (auto ok = gpu::validate(s); !ok)
    return std::move(ok).error();
  return s;
}

status fits_runner(const gpu::llama_shape& built, const model_config& config) {
  auto s = llama_shape_of(config);
  if (!s)
    return std::move(s).error();
  auto differs = [&](const char* field, uint64_t want, uint64_t got) {
    return make_error(errc::invalid_argument,
                      std::string{"its "} + field + " is " + std::to_string(got)
                        + " but the engine's device runner was built for " + std::to_string(want));
  };
  if (s->hidden != built.hidden)
    return differs("hidden_size", built.hidden, s->hidden);
  if (s->intermediate != built.intermediate)
    return differs("intermediate_size", built.intermediate, s->intermediate);
  if (s->layers != built.layers)
    return differs("num_hidden_layers", built.layers, s->layers);
  if (s->heads != built.heads)
    return differs("num_attention_heads", built.heads, s->heads);
  if (s->kv_heads != built.kv_heads)
    return differs("num_key_value_heads", built.kv_heads, s->kv_heads);
  if (s->vocab != built.vocab)
    return differs("vocab_size", built.vocab, s->vocab);
  if (s->max_positions > built.max_positions)
    return differs("max_position_embeddings", built.max_positions, s->max_positions);
  if (s->bf16 != built.bf16)
    return make_error(errc::invalid_argument, std::string{"its torch_dtype is "}
                                                + (s->bf16 ? "bfloat16" : "float32")
                                                + " but the engine's device runner was built for "
                                                + (built.bf16 ? "bfloat16" : "float32"));
  return {};
}

result<std::shared_ptr<const device_weights>>
bind_device_weights(const model_config& config,
                    std::map<std::string, std::shared_ptr<const gpu::device_buffer>> buffers) {
  auto out = std::make_shared<device_weights>();
  out->buffers = std::move(buffers);
  auto at = [&](const std::string& name) -> const void* {
    auto it = out->buffers.find(name);
    return it == out->buffers.end() || !it->second ? nullptr : it->second->data();
  };
  auto& p = out->pointers;
  p.embed_tokens = at("model.embed_tokens.weight");
  p.norm = at("model.norm.weight");
  p.lm_head = at("lm_head.weight");
  p.rms_norm_eps = config.rms_norm_eps;
  p.rope_theta = config.rope_theta;
  p.layers.resize(config.num_hidden_layers);
  for (uint32_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    auto& lw = p.layers[l];
    lw.q_proj = at(prefix + "self_attn.q_proj.weight");
    lw.k_proj = at(prefix + "self_attn.k_proj.weight");
    lw.v_proj = at(prefix + "self_attn.v_proj.weight");
    lw.o_proj = at(prefix + "self_attn.o_proj.weight");
    lw.gate_proj = at(prefix + "mlp.gate_proj.weight");
    lw.up_proj = at(prefix + "mlp.up_proj.weight");
    lw.down_proj = at(prefix + "mlp.down_proj.weight");
    lw.input_layernorm = at(prefix + "input_layernorm.weight");
    lw.post_attention_layernorm = at(prefix + "post_attention_layernorm.weight");
  }
  for (const auto& spec : expected_tensors(config))
    if (!at(spec.name))
      return make_error(errc::invalid_argument, "the device copy lacks tensor " + spec.name);
  return std::shared_ptr<const device_weights>{std::move(out)};
}

device_budget device_budget_for(const model_config& config, uint32_t slots,
                                uint64_t staging_bytes) {
  device_budget b;
  const uint64_t element = config.torch_dtype == weight_dtype::bfloat16 ? 2 : 4;
  b.weights = config.parameter_count() * element;
  b.shadow = b.weights;
  if (auto shape = llama_shape_of(config))
    b.workspace = gpu::llama_runner::workspace_bytes(*shape, slots);
  b.staging = staging_bytes;
  return b;
}

status check_budget(const device_budget& b, uint64_t free, const std::string& device_label) {
  if (b.total() <= free)
    return {};
  return make_error(errc::limit_exceeded, "the replica needs " + gib(b.total()) + " on "
                                            + device_label + " (weights " + gib(b.weights)
                                            + ", a shadow for the next version " + gib(b.shadow)
                                            + ", KV cache and activations " + gib(b.workspace)
                                            + ", staging " + gib(b.staging) + ") but " + gib(free)
                                            + " is free; lower engine.max_batch or the model's "
                                              "max_position_embeddings, or use a larger device");
}

} // namespace stitch::engine
