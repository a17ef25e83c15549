// Partial reloads of an external engine: a delta that changes few tensors
// is loaded as a folder of just those tensors, then each one is read back
// from the engine and compared with the staged bytes before it serves.
//
// SGLang (python/sglang/srt/model_executor/model_runner.py@01cc04e2
// `update_weights_from_disk` and `get_weights_by_name`,
// entrypoints/http_server.py@3ba38dc0 `/get_weights_by_name`,
// managers/io_struct.py `GetWeightsByNameReqInput`):
//   - update_weights_from_disk hands every safetensors file of `model_path`
//     to the model's `load_weights`, which copies each given tensor into its
//     (fused, tensor-parallel) parameter in place; parameters given nothing
//     keep their values. Quantized layers are re-processed after loading
//     (`process_weights_after_loading`), which a partial set would not make
//     exact: quantized models get full reloads.
//   - POST /get_weights_by_name {"name", "truncate_size"} answers the
//     parameter as `tensor.float().tolist()[:truncate_size]` (rows of a
//     matrix; one list per data-parallel rank when dp > 1), or 400 "Get
//     parameter by name failed" for a name the model cannot map.
// vLLM is given full reloads: its layerwise reload
// (vllm/model_executor/model_loader/reload/layerwise.py@fc26ee2a) rebuilds a layer
// given only part of its weights from uninitialized storage, and its
// weight checker (serve/dev/rlhf/api_router.py@0100a212 `/weight_checker`) hashes the
// engine's fused parameters, and only while unpaused: nothing exact to
// compare a partial load with before it serves.
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstring>

#include "gpu/checksum.hpp"
#include "runtime/engine/external_engine.hpp"
#include "runtime/engine/external_engine_detail.hpp"
#include "runtime/pipeline/hf_directory.hpp"

namespace stitch::engine {

namespace fs = std::filesystem;
using namespace detail;

namespace {

/// IEEE half to float (exact).
float from_f16(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  uint32_t bits =
    exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  return std::bit_cast<float>(bits);
}

/// The staged element `i` of a tensor of `type`, as the float the engine's
/// `.float()` makes of it.
float element(std::span<const std::byte> bytes, safetensors::dtype type, uint64_t i) {
  if (type == safetensors::dtype::f32) {
    float v = 0;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  }
  uint16_t h = 0;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  if (type == safetensors::dtype::bf16)
    return std::bit_cast<float>(uint32_t{h} << 16);
  return from_f16(h);
}

/// Compares the numbers of a `/get_weights_by_name` answer with the staged
/// tensor as they stream past (an answer is never held as a JSON tree):
/// nested lists of numbers, `null` standing for a value JSON cannot carry
/// (NaN, infinity), repeated once per data-parallel rank.
struct readback_check final : nlohmann::json_sax<nlohmann::json> {
  std::span<const std::byte> staged;
  safetensors::dtype type = safetensors::dtype::f32;
  uint64_t elements = 0;
  uint64_t seen = 0;
  uint64_t depth = 0;
  /// The first element that differs, and the shape error if any.
  std::optional<uint64_t> differs;
  std::string malformed;

  bool value(double got, bool is_null) {
    if (elements == 0)
      return fail("values for an empty tensor");
    uint64_t i = seen++ % elements;
    if (differs)
      return true;
    float want = element(staged, type, i);
    bool same =
      is_null ? !std::isfinite(want)
              : std::bit_cast<uint32_t>(static_cast<float>(got)) == std::bit_cast<uint32_t>(want);
    if (!same)
      differs = i;
    return true;
  }
  bool fail(std::string why) {
    if (malformed.empty())
      malformed = std::move(why);
    return false;
  }

  bool null() override { return value(0, true); }
  bool boolean(bool) override { return fail("a boolean"); }
  bool number_integer(number_integer_t v) override { return value(static_cast<double>(v), false); }
  bool number_unsigned(number_unsigned_t v) override {
    return value(static_cast<double>(v), false);
  }
  bool number_float(number_float_t v, const string_t&) override { return value(v, false); }
  bool string(string_t&) override { return fail("a string"); }
  bool binary(binary_t&) override { return fail("binary data"); }
  bool start_object(std::size_t) override { return fail("an object"); }
  bool key(string_t&) override { return fail("an object"); }
  bool end_object() override { return fail("an object"); }
  bool start_array(std::size_t) override {
    return ++depth <= 8 || fail("lists nested deeper than 8");
  }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t at, const std::string&,
                   const nlohmann::detail::exception&) override {
    return fail("not JSON (at byte " + std::to_string(at) + ")");
  }
};

bool readable(safetensors::dtype t) {
  return t == safetensors::dtype::f32 || t == safetensors::dtype::bf16
         || t == safetensors::dtype::f16;
}

} // namespace

std::optional<engine_load_report> external_engine::last_load() {
  std::lock_guard lock{mutex_};
  return last_load_;
}

std::string external_engine::partial_refusal(const chain_plan& plan,
                                             const std::optional<staged>& base, bool onto_shadow,
                                             const staged& next,
                                             const pipeline::hf_checkpoint& staged_dir) const {
  if (opts_.kind != engine_kind::sglang)
    return "vLLM reloads in full: its layerwise reload rebuilds a layer given part of its "
           "weights from uninitialized storage, and it cannot read its tensors back while paused";
  if (opts_.partial_reload_max_bytes == 0)
    return "engine.partial_reload_max_bytes = 0";
  {
    std::lock_guard lock{mutex_};
    if (!partial_off_.empty())
      return partial_off_;
  }
  if (plan.anchor || !base)
    return "built from its anchor";
  if (onto_shadow)
    return "staged over a version not yet activated";
  if (next.restart)
    return "its config.json changes the architecture";
  if (next.config.find("\"quantization_config\"") != std::string::npos)
    return "a quantized model (config.json has quantization_config): the engine re-processes "
           "whole layers after a load";
  if (plan.touched.empty())
    return "no tensor changed";
  const auto* ckpt = &staged_dir;
  if (plan.touched.size() >= ckpt->tensors.size())
    return "its deltas change every tensor";
  uint64_t bytes = 0;
  for (const auto& name : plan.touched) {
    auto t = ckpt->tensors.find(name);
    if (t == ckpt->tensors.end())
      return "tensor '" + name + "' is not in the staged folder";
    if (!readable(t->second.type))
      return "tensor '" + name + "' is " + std::string{safetensors::to_string(t->second.type)}
             + ", which the engine cannot read back exactly";
    if (t->second.shape.empty() || t->second.shape[0] == 0)
      return "tensor '" + name + "' is a scalar or empty, which the engine cannot read back";
    bytes += t->second.size;
  }
  if (bytes > opts_.partial_reload_max_bytes)
    return "its changed tensors hold " + std::to_string(bytes)
           + " bytes, more than engine.partial_reload_max_bytes ("
           + std::to_string(opts_.partial_reload_max_bytes) + ")";
  return {};
}

status external_engine::write_partial(staged& next, const chain_plan& plan, const version_ref& base,
                                      const manifest& target,
                                      const pipeline::hf_checkpoint& staged_dir) {
  const auto* ckpt = &staged_dir;
  std::vector<safetensors::tensor_spec> specs;
  uint64_t bytes = 0;
  for (const auto& name : plan.touched) {
    const auto& t = ckpt->tensors.at(name);
    specs.push_back({t.name, t.type, t.shape});
    bytes += t.size;
  }
  std::vector<std::byte> piece(size_t{8} << 20);
  pipeline::tensor_filler fill = [&](const std::string& name,
                                     const safetensors::byte_sink& sink) -> status {
    // The bytes the full folder holds, verified when it was written.
    return pipeline::stream_tensor(*ckpt, name, piece, sink);
  };
  std::map<std::string, std::string> files;
  if (!next.config.empty())
    files.emplace("config.json", next.config);
  fs::path dir = next.dir;
  dir += "@partial";
  if (auto ok = pipeline::write_hf_directory(dir, specs, fill, opts_.max_shard_bytes, false, files);
      !ok)
    return ok;
  next.partial_dir = dir;
  next.partial_base = base;
  next.partial_tensors.assign(plan.touched.begin(), plan.touched.end());
  next.partial_bytes = bytes;
  next.partial_digests.clear();
  for (const auto& name : plan.touched) {
    auto digest = target.checksums.find(name);
    if (digest == target.checksums.end())
      return make_error(errc::corrupt_data,
                        to_string(next.ref) + "'s manifest has no checksum for '" + name + "'");
    next.partial_digests.emplace(name, digest->second);
  }
  return {};
}

status external_engine::read_back(const staged& s, std::string* unanswerable) {
  // The caller holds control_mutex_.
  auto ckpt = pipeline::open_hf_directory(s.partial_dir);
  if (!ckpt)
    return std::move(ckpt).error();
  std::vector<std::byte> bytes;
  for (const auto& name : s.partial_tensors) {
    auto found = ckpt->tensors.find(name);
    if (found == ckpt->tensors.end())
      return make_error(errc::corrupt_data,
                        "tensor '" + name + "' is missing from " + s.partial_dir.string());
    const auto& t = found->second;
    bytes.resize(t.size);
    if (auto ok = pipeline::read_tensor(*ckpt, name, bytes); !ok)
      return ok;
    // What the engine was given is what was published...
    auto digest = s.partial_digests.find(name);
    if (digest == s.partial_digests.end() || gpu::parallel_tree_checksum(bytes) != digest->second)
      return make_error(errc::checksum_mismatch, "the staged tensor '" + name + "' of "
                                                   + to_string(s.ref)
                                                   + " no longer matches its manifest checksum");
    // ...and what it serves is what it was given.
    uint64_t elements = 1;
    for (auto d : t.shape)
      elements *= d;
    // One number is at most ~16 characters of JSON, plus separators.
    transport::http_client_options o;
    o.connect_timeout = std::chrono::milliseconds{5'000};
    o.io_timeout = opts_.update_timeout;
    o.max_body_bytes = static_cast<size_t>(std::min<uint64_t>(elements * 32 + 65536, 4ull << 30));
    transport::http_client client{endpoint(), o};
    json body = {{"name", name}, {"truncate_size", t.shape[0]}};
    auto r =
      call_json(client, "POST", "/get_weights_by_name", dump(body), opts_.update_timeout, closing_);
    if (!r)
      return make_error(errc::activation_failed,
                        describe() + " /get_weights_by_name " + name + ": " + r.error().message);
    if (r->status != 200) {
      *unanswerable = "it cannot read tensor '" + name + "' back (/get_weights_by_name answered "
                      + std::to_string(r->status) + ": " + excerpt(r->body) + ")";
      return make_error(errc::activation_failed, describe() + ": " + *unanswerable);
    }
    readback_check check;
    check.staged = bytes;
    check.type = t.type;
    check.elements = elements;
    bool parsed = nlohmann::json::sax_parse(r->body, &check);
    if (!parsed || check.seen == 0 || check.seen % elements != 0) {
      *unanswerable =
        "its answer for tensor '" + name + "' is not the tensor's " + std::to_string(elements)
        + " values ("
        + (check.malformed.empty() ? std::to_string(check.seen) + " numbers" : check.malformed)
        + ")";
      return make_error(errc::activation_failed, describe() + ": " + *unanswerable);
    }
    if (check.differs)
      return make_error(errc::checksum_mismatch, describe() + " serves tensor '" + name
                                                   + "' differently from " + to_string(s.ref)
                                                   + " after a partial reload (element "
                                                   + std::to_string(*check.differs) + " differs)");
  }
  return {};
}

} // namespace stitch::engine
