#include "runtime/engine/weights.hpp"

#include <cstring>
#include <mutex>
#include <optional>

#include "gpu/cpu_parallel.hpp"

namespace stitch::engine {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : text) {
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  }
  return h;
}

/// xoshiro256** seeded through splitmix64.
class xoshiro256 {
public:
  explicit xoshiro256(uint64_t seed) {
    for (auto& word : s_) {
      word = splitmix64(seed);
    }
  }
  uint64_t next() noexcept {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1) with 24 bits, exact in float.
  float uniform() noexcept { return static_cast<float>(next() >> 40) * 0x1.0p-24F; }

private:
  static uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  // Round to nearest even; values are finite here.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t value) {
  uint32_t bits = uint32_t{value} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

std::string layer_prefix(uint32_t layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return out + "]";
}

safetensors::dtype tensor_dtype(weight_dtype type) {
  return type == weight_dtype::bfloat16 ? safetensors::dtype::bf16 : safetensors::dtype::f32;
}

/// The tensor as floats: a view in place for fp32, widened into a new
/// buffer (kept in `widened`) for bf16.
result<std::span<const float>>
floats_of(const tensor_buffer& t, std::vector<std::shared_ptr<const gpu::host_buffer>>& widened,
          std::mutex& widened_mutex) {
  if (t.type == safetensors::dtype::f32)
    return std::span<const float>{reinterpret_cast<const float*>(t.bytes.data()),
                                  t.bytes.size() / 4};
  const size_t n = t.bytes.size() / 2;
  auto out = gpu::staging_allocator().allocate(n * 4);
  if (!out)
    return std::move(out).error();
  auto* dst = reinterpret_cast<float*>(out->data());
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, t.bytes.data() + i * 2, 2);
    dst[i] = from_bf16(v);
  }
  auto shared = std::make_shared<const gpu::host_buffer>(std::move(*out));
  std::lock_guard guard{widened_mutex};
  widened.push_back(shared);
  return std::span<const float>{reinterpret_cast<const float*>(shared->data()), n};
}

} // namespace

std::vector<tensor_spec> expected_tensors(const model_config& c) {
  uint64_t h = c.hidden_size;
  uint64_t kv = c.kv_width();
  uint64_t im = c.intermediate_size;
  std::vector<tensor_spec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = layer_prefix(l);
    specs.push_back({p + "self_attn.q_proj.weight", {h, h}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    specs.push_back({p + "self_attn.o_proj.weight", {h, h}});
    if (c.is_moe()) {
      const uint64_t hd = c.head_dim();
      const uint64_t mi = c.moe_intermediate_size;
      specs.push_back({p + "self_attn.q_norm.weight", {hd}});
      specs.push_back({p + "self_attn.k_norm.weight", {hd}});
      specs.push_back({p + "mlp.gate.weight", {c.num_experts, h}});
      for (uint32_t e = 0; e < c.num_experts; ++e) {
        std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        specs.push_back({x + "gate_proj.weight", {mi, h}});
        specs.push_back({x + "up_proj.weight", {mi, h}});
        specs.push_back({x + "down_proj.weight", {h, mi}});
      }
    } else {
      specs.push_back({p + "mlp.gate_proj.weight", {im, h}});
      specs.push_back({p + "mlp.up_proj.weight", {im, h}});
      specs.push_back({p + "mlp.down_proj.weight", {h, im}});
    }
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  specs.push_back({"model.norm.weight", {h}});
  specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

status check_tensors(const model_config& config, const tensor_map& tensors) {
  if (auto ok = validate(config); !ok) {
    return std::move(ok).error();
  }
  auto specs = expected_tensors(config);
  auto want_type = tensor_dtype(config.torch_dtype);
  size_t element_size = want_type == safetensors::dtype::bf16 ? 2 : 4;
  for (const auto& spec : specs) {
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) {
      return make_error(errc::invalid_argument, "weights: tensor " + spec.name + " is missing");
    }
    const auto& t = *it->second;
    if (t.type != want_type) {
      return make_error(errc::invalid_argument, "weights: tensor " + spec.name + " has dtype "
                                                  + std::string(safetensors::to_string(t.type))
                                                  + ", expected "
                                                  + std::string(safetensors::to_string(want_type)));
    }
    if (t.shape != spec.shape) {
      return make_error(errc::invalid_argument, "weights: tensor " + spec.name + " has shape "
                                                  + shape_text(t.shape) + ", expected "
                                                  + shape_text(spec.shape));
    }
    uint64_t elements = 1;
    for (auto d : spec.shape) {
      elements *= d;
    }
    if (t.bytes.size() != elements * element_size) {
      return make_error(errc::invalid_argument,
                        "weights: tensor " + spec.name + " holds " + std::to_string(t.bytes.size())
                          + " bytes, expected " + std::to_string(elements * element_size));
    }
  }
  if (tensors.size() != specs.size()) {
    for (const auto& [name, t] : tensors) {
      bool known = false;
      for (const auto& spec : specs) {
        known = known || spec.name == name;
      }
      if (!known) {
        return make_error(errc::invalid_argument,
                          "weights: unexpected tensor " + quote_untrusted(name));
      }
    }
  }
  return {};
}

result<std::shared_ptr<weights>> bind_weights(const model_config& config, tensor_map tensors) {
  if (auto ok = check_tensors(config, tensors); !ok)
    return std::move(ok).error();
  auto w = std::make_shared<weights>();
  w->config = config;
  w->tensors = std::move(tensors);
  return w;
}

result<std::shared_ptr<const weights>> build_weights(const model_config& config,
                                                     tensor_map tensors) {
  if (auto ok = check_tensors(config, tensors); !ok)
    return std::move(ok).error();
  auto specs = expected_tensors(config);
  auto w = std::make_shared<weights>();
  w->config = config;
  std::mutex widened_mutex;
  std::optional<stitch::error> failure;
  std::mutex failure_mutex;
  auto floats = [&](const std::string& name) -> std::span<const float> {
    auto f = floats_of(*tensors.at(name), w->widened, widened_mutex);
    if (!f) {
      std::lock_guard guard{failure_mutex};
      failure = f.error();
      return {};
    }
    return *f;
  };
  auto mat = [&](const std::string& name) {
    const auto& t = *tensors.at(name);
    return matrix{static_cast<uint32_t>(t.shape[0]), static_cast<uint32_t>(t.shape[1]),
                  floats(name)};
  };
  w->embed_tokens = mat("model.embed_tokens.weight");
  w->layers.resize(config.num_hidden_layers);
  gpu::shared_pool().run(config.num_hidden_layers, [&](size_t l) {
    std::string p = layer_prefix(static_cast<uint32_t>(l));
    auto& layer = w->layers[l];
    layer.q_proj = mat(p + "self_attn.q_proj.weight");
    layer.k_proj = mat(p + "self_attn.k_proj.weight");
    layer.v_proj = mat(p + "self_attn.v_proj.weight");
    layer.o_proj = mat(p + "self_attn.o_proj.weight");
    if (config.is_moe()) {
      layer.q_norm = floats(p + "self_attn.q_norm.weight");
      layer.k_norm = floats(p + "self_attn.k_norm.weight");
      layer.router = mat(p + "mlp.gate.weight");
      layer.experts.resize(config.num_experts);
      for (uint32_t e = 0; e < config.num_experts; ++e) {
        std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        layer.experts[e] = {mat(x + "gate_proj.weight"), mat(x + "up_proj.weight"),
                            mat(x + "down_proj.weight")};
      }
    } else {
      layer.gate_proj = mat(p + "mlp.gate_proj.weight");
      layer.up_proj = mat(p + "mlp.up_proj.weight");
      layer.down_proj = mat(p + "mlp.down_proj.weight");
    }
    layer.input_layernorm = floats(p + "input_layernorm.weight");
    layer.post_attention_layernorm = floats(p + "post_attention_layernorm.weight");
  });
  w->norm = floats("model.norm.weight");
  w->lm_head = mat("lm_head.weight");
  if (failure)
    return *failure;
  w->tensors = std::move(tensors);
  return std::shared_ptr<const weights>(std::move(w));
}

result<std::shared_ptr<tensor_buffer>> make_tensor_buffer(std::string name, safetensors::dtype type,
                                                          std::vector<uint64_t> shape) {
  auto size = safetensors::byte_length(type, shape);
  if (!size)
    return make_error(errc::invalid_argument,
                      "tensor " + quote_untrusted(name) + ": " + size.error().message);
  auto bytes = gpu::staging_allocator().allocate(*size);
  if (!bytes)
    return std::move(bytes).error();
  auto t = std::make_shared<tensor_buffer>();
  t->name = std::move(name);
  t->type = type;
  t->shape = std::move(shape);
  t->bytes = std::move(*bytes);
  return t;
}

result<tensor_map> to_tensor_map(const pipeline::tensor_set& tensors) {
  tensor_map out;
  for (const auto& [name, t] : tensors) {
    auto b = make_tensor_buffer(name, t.type, t.shape);
    if (!b)
      return std::move(b).error();
    if ((*b)->bytes.size() != t.bytes.size())
      return make_error(errc::invalid_argument, "weights: tensor " + quote_untrusted(name)
                                                  + " holds " + std::to_string(t.bytes.size())
                                                  + " bytes, expected "
                                                  + std::to_string((*b)->bytes.size()));
    if (!t.bytes.empty())
      std::memcpy((*b)->bytes.data(), t.bytes.data(), t.bytes.size());
    out.emplace(name, std::move(*b));
  }
  return out;
}

result<std::shared_ptr<const weights>> build_weights(const model_config& config,
                                                     const pipeline::tensor_set& tensors) {
  auto map = to_tensor_map(tensors);
  if (!map)
    return std::move(map).error();
  return build_weights(config, std::move(*map));
}

result<pipeline::tensor_set> random_init(const model_config& config, uint64_t seed) {
  if (auto ok = validate(config); !ok) {
    return std::move(ok).error();
  }
  auto specs = expected_tensors(config);
  auto type = tensor_dtype(config.torch_dtype);
  std::vector<pipeline::host_tensor> built(specs.size());
  gpu::shared_pool().run(specs.size(), [&](size_t i) {
    const auto& spec = specs[i];
    uint64_t elements = 1;
    for (auto d : spec.shape) {
      elements *= d;
    }
    bool is_norm = spec.shape.size() == 1;
    uint64_t state = seed ^ fnv1a(spec.name);
    xoshiro256 gen(splitmix64(state));
    auto& t = built[i];
    t.name = spec.name;
    t.type = type;
    t.shape = spec.shape;
    t.bytes.resize(elements * (type == safetensors::dtype::bf16 ? 2 : 4));
    for (uint64_t e = 0; e < elements; ++e) {
      float value = 1.0F;
      if (!is_norm) {
        // Irwin-Hall: the sum of four uniforms has variance 1/3; recentred
        // and scaled it is a bounded, libm-free stand-in for N(0, 0.02^2).
        float sum = gen.uniform() + gen.uniform() + gen.uniform() + gen.uniform();
        value = (sum - 2.0F) * 1.7320508F * 0.02F;
      }
      if (type == safetensors::dtype::bf16) {
        uint16_t v = to_bf16(value);
        std::memcpy(t.bytes.data() + e * 2, &v, 2);
      } else {
        std::memcpy(t.bytes.data() + e * 4, &value, 4);
      }
    }
  });
  pipeline::tensor_set out;
  for (auto& t : built) {
    std::string name = t.name;
    out.emplace(std::move(name), std::move(t));
  }
  return out;
}

} // namespace stitch::engine
