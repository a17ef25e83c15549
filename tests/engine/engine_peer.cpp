// stitch-engine-peer: a test stand-in for an SGLang or vLLM server.
//
// Neither engine can be installed on the machines the tests run on, so the
// adapters of `runtime/engine/external_engine.cpp` are tested against this
// program. It implements the part of each engine's HTTP API the adapter
// uses, with the engine's own routes, field names, status codes and body
// shapes, and generates with the built-in CPU model from the directory it
// was told to load (read with the project's safetensors reader, so a wrong
// or partial staged directory is caught). It records every call, and can
// be told to fail, hang, or exit.
//
// SGLang (python/sglang/srt/entrypoints/http_server.py and
// managers/io_struct.py, v0.5.6 and the 2026 main line):
//   GET  /health, /health_generate      200, empty body; 503 while starting (--starting-ms),
//                                        or when paused past the health-check timeout (a
//                                        one-token generation runs there)
//   POST /generate                      {text, sampling_params, return_logprob, stream, rid,
//                                        extra_key} -> {text, output_ids, meta_info{id,
//                                        finish_reason{type}, prompt_tokens, completion_tokens,
//                                        cached_tokens, weight_version, ...}}; stream: cumulative
//                                        `data:` events, then `data: [DONE]`
//   POST /v1/completions, /v1/chat/completions  OpenAI shapes + metadata.weight_version
//   POST /pause_generation              {mode: abort|retract|in_place} -> {message, status: "ok"}
//   POST /continue_generation           -> {message, status: "ok"}
//   POST /update_weights_from_disk      {model_path, weight_version, abort_all_requests,
//                                        flush_cache, load_format, keep_pause} -> 200/400
//                                        {success, message, num_paused_requests}; without
//                                        keep_pause a paused scheduler runs again after the load;
//                                        without load_format the server's (--load-format dummy:
//                                        random weights)
//   GET  /model_info, /get_model_info   {model_path, weight_version, ...}
//   GET  /get_weight_version            {weight_version}; 404 with --sglang-2026 (the 2026
//                                        line answers "deprecated, use /model_info")
//   POST /flush_cache                   plain text, 200
//   POST /abort_request                 {rid} -> 200, empty body
//   POST /get_weights_by_name           {name, truncate_size = 100} -> the parameter as
//                                        `tensor.float().tolist()[:truncate_size]` (a matrix's
//                                        rows), NaN and infinities as null; an unknown name:
//                                        400 {"error": {"message": "Get parameter by name
//                                        failed"}} (http_server.py@3ba38dc0,
//                                        model_runner.py@01cc04e2)
//   update_weights_from_disk of a folder holding some of the model's tensors updates
//   just those (the model's load_weights, model_runner.py@01cc04e2); vLLM's reload
//   is given every tensor (the adapter never sends it part of a model).
//
// vLLM (vllm/entrypoints/serve/*/api_router.py, v0.16, VLLM_SERVER_DEV_MODE=1):
//   GET  /health                        200, empty body
//   POST /v1/completions, /v1/chat/completions  OpenAI shapes (cache_salt recorded;
//                                        `return_token_ids`: each choice's `token_ids`)
//   GET  /v1/models                     {object: "list", data: [...]}
//   POST /pause?mode=abort|wait|keep    {status: "paused"}
//   POST /resume                        {status: "resumed"}
//   GET  /is_paused                     {is_paused}
//   POST /collective_rpc                {method: "reload_weights", kwargs: {weights_path,
//                                        is_checkpoint_format}} -> {results: [null]};
//                                        a failing worker: 500 text/plain
//   POST /reset_prefix_cache            200, empty body
//   POST /update_weight_version         {new_version} -> {success, new_version}
//   GET  /weight_info                   {weight_version, weight_gen, weight_label}
//                                       (vllm/entrypoints/serve/dev/rlhf/api_router.py, 2026;
//                                       both 404 with --vllm-2025)
//   /generate does not exist in `vllm serve`: 404 {"detail": "Not Found"}.
//
// Test controls (not part of either engine):
//   GET  /_peer/calls                   the recorded calls, one per line
//   POST /_peer/fail_updates?n=N        the next N weight updates fail
//   POST /_peer/hang_updates?n=N        the next N weight updates never answer
//   POST /_peer/garbage?n=N             the next N generations answer a body that is not JSON
//   POST /_peer/odd_usage?n=N           the next N completions carry `usage` of the wrong types
//   POST /_peer/exit                    the process exits at once (a crash)
//   POST /_peer/corrupt_loads?tensor=T  each later load that gives tensor T flips a bit of
//                                        its first element (a load that went wrong)
//   POST /_peer/no_readback             /get_weights_by_name answers 400 for every name (a
//                                        model whose runner cannot map names)
//
// Usage: stitch-engine-peer --dialect sglang|vllm --port P --model-dir DIR
//                           [--weight-version V] [--sglang-2026] [--vllm-2025]
//                           [--load-format auto|dummy] [--starting-ms N]

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <execinfo.h>
#include <unistd.h>

#include "runtime/engine/api_shapes.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "transport/http_server.hpp"

namespace {

using namespace stitch;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;
using transport::http_responder;
using transport::server_request;
using transport::server_response;

struct loaded {
  std::shared_ptr<const engine::weights> weights;
  engine::model_config config;
  std::string path;
  /// What `weights` were built from (SGLang's partial loads start from it).
  pipeline::tensor_set tensors;
};

/// Loads an HF directory the way the engines do: config.json, then every
/// shard (the project's reader checks the files against each other).
/// `onto`: SGLang's update_weights_from_disk (model_executor/model_runner.py
/// -> the model's load_weights) copies each tensor the folder holds into
/// its parameter and leaves the others as they are, so a folder of some
/// tensors updates just those; each must match its parameter's dtype and
/// shape. Without `onto` (a start, or vLLM) every tensor must be there.
result<loaded> load_model(const std::string& dir, const loaded* onto = nullptr) {
  std::ifstream in{fs::path{dir} / "config.json"};
  if (!in)
    return make_error(errc::not_found, dir + "/config.json cannot be opened");
  std::stringstream text;
  text << in.rdbuf();
  auto config = engine::parse_model_config(text.str());
  if (!config)
    return std::move(config).error();
  auto tensors = pipeline::load_hf_directory(dir);
  if (!tensors)
    return std::move(tensors).error();
  if (onto && onto->weights) {
    auto merged = onto->tensors;
    for (auto& [name, t] : *tensors) {
      auto at = merged.find(name);
      if (at == merged.end())
        return make_error(errc::invalid_argument, "the model has no parameter " + name);
      if (at->second.type != t.type || at->second.shape != t.shape)
        return make_error(errc::invalid_argument, name + " does not match its parameter's shape");
      at->second = std::move(t);
    }
    *tensors = std::move(merged);
    config = onto->config;
  }
  auto w = engine::build_weights(*config, *tensors);
  if (!w)
    return std::move(w).error();
  return loaded{std::move(*w), *config, dir, std::move(*tensors)};
}

class peer {
public:
  peer(std::string dialect, bool sglang_2026, bool vllm_2025, std::string load_format,
       std::chrono::milliseconds starting)
      : dialect_(std::move(dialect)), new_api_(sglang_2026), old_vllm_(vllm_2025),
        load_format_(std::move(load_format)),
        ready_at_(std::chrono::steady_clock::now() + starting) {}

  status boot(const std::string& dir, std::string version) {
    auto m = load_model(dir);
    if (!m)
      return std::move(m).error();
    std::lock_guard lock{mutex_};
    model_ = std::move(*m);
    weight_version_ = std::move(version);
    return {};
  }

  void handle(server_request req, std::shared_ptr<http_responder> out) {
    // Generations and updates take time: each request gets a thread.
    std::thread{[this, req = std::move(req), out = std::move(out)]() mutable {
      serve(std::move(req), *out);
    }}.detach();
  }

private:
  static server_response json_answer(unsigned status, const json& body) {
    server_response r;
    r.status = status;
    r.body = body.dump();
    return r;
  }
  static server_response empty(unsigned status = 200) {
    server_response r;
    r.status = status;
    r.content_type = "text/plain";
    return r;
  }
  static uint64_t count_of(const server_request& req) {
    auto at = req.target.find("n=");
    return at == std::string::npos ? 1 : std::strtoull(req.target.c_str() + at + 2, nullptr, 10);
  }

  void record(const std::string& line) {
    std::lock_guard lock{mutex_};
    calls_ += line + "\n";
  }

  /// Waits while paused (SGLang's in_place and vLLM's keep modes hold
  /// requests; new ones wait too), then returns the weights to step on.
  std::shared_ptr<const engine::weights> current() {
    std::unique_lock lock{mutex_};
    resumed_.wait(lock, [&] { return !paused_; });
    return model_.weights;
  }

  void serve(server_request req, http_responder& out) {
    const bool sglang = dialect_ == "sglang";
    const std::string& path = req.path;
    std::string line = req.method + " " + req.target;
    if (req.method == "POST" && !req.body.empty() && req.body.size() < 4096)
      line += " " + req.body;
    if (!path.starts_with("/_peer/"))
      record(line);
    if (path == "/_peer/calls") {
      std::lock_guard lock{mutex_};
      server_response r = empty();
      r.body = calls_;
      return out.send(std::move(r));
    }
    if (path == "/_peer/fail_updates") {
      fail_updates_ = count_of(req);
      return out.send(empty());
    }
    if (path == "/_peer/hang_updates") {
      hang_updates_ = count_of(req);
      return out.send(empty());
    }
    if (path == "/_peer/garbage") {
      garbage_ = count_of(req);
      return out.send(empty());
    }
    if (path == "/_peer/odd_usage") {
      odd_usage_ = count_of(req);
      return out.send(empty());
    }
    if (path == "/_peer/exit")
      ::_exit(3);
    if (path == "/_peer/corrupt_loads") {
      auto at = req.target.find("tensor=");
      std::lock_guard lock{mutex_};
      corrupt_tensor_ = at == std::string::npos ? "" : req.target.substr(at + 7);
      return out.send(empty());
    }
    if (path == "/_peer/no_readback") {
      no_readback_ = true;
      return out.send(empty());
    }
    if (path == "/health" || (path == "/health_generate" && sglang))
      return out.send(health(sglang));
    if (req.method == "GET" || path == "/tokenize" || path == "/detokenize")
      if (auto info = information(req, sglang))
        return out.send(std::move(*info));
    if (path == "/generate" && sglang)
      return generate(req, out, engine::api_kind::native);
    if (path == "/v1/completions")
      return generate(req, out, engine::api_kind::completions);
    if (path == "/v1/chat/completions")
      return generate(req, out, engine::api_kind::chat);
    if (sglang)
      return sglang_control(req, out);
    return vllm_control(req, out);
  }

  /// SGLang's `/health` (http_server.py@3ba38dc0, lines 665-743): 503
  /// while starting; else a one-token generation, which waits while the
  /// scheduler is paused and answers 503 when it does not run within the
  /// health-check timeout (20 s there, 2 s here). vLLM's (instrumentator/
  /// health.py): 200 while the engine lives, no generation.
  server_response health(bool sglang) {
    if (std::chrono::steady_clock::now() < ready_at_)
      return empty(503);
    if (!sglang)
      return empty();
    std::unique_lock lock{mutex_};
    if (!resumed_.wait_for(lock, std::chrono::seconds{2}, [&] { return !paused_; }))
      return empty(503);
    return empty();
  }

  /// The read-only routes and tokenizer routes of each engine (what a
  /// replica passes through); nothing for other requests.
  std::optional<server_response> information(const server_request& req, bool sglang) {
    const std::string& path = req.path;
    std::lock_guard lock{mutex_};
    if ((path == "/get_server_info" || path == "/server_info") && sglang)
      return json_answer(200, {{"model_path", model_.path},
                               {"tp_size", 1},
                               {"version", "0.5.6"},
                               {"weight_version", weight_version_}});
    if (path == "/get_load" && sglang)
      return json_answer(200,
                         json::array({{{"dp_rank", 0}, {"num_reqs", 0}, {"num_waiting_reqs", 0}}}));
    if (path == "/load" && !sglang)
      return json_answer(200, {{"server_load", 0}});
    if (path == "/ping" && !sglang)
      return empty();
    if (path == "/version" && !sglang)
      return json_answer(200, {{"version", "0.16.0"}});
    if (path == "/metrics") {
      server_response r = empty();
      r.body = sglang ? "sglang:num_running_reqs 0\n" : "vllm:num_requests_running 0\n";
      return r;
    }
    if (path == "/v1/models")
      return json_answer(200,
                         {{"object", "list"},
                          {"data", json::array({{{"id", model_.path},
                                                 {"object", "model"},
                                                 {"owned_by", sglang ? "sglang" : "vllm"}}})}});
    if (path == "/tokenize" || path == "/detokenize") {
      auto body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
      if (!body.is_object())
        return json_answer(400, {{"error", {{"message", "the body is not a JSON object"}}}});
      if (path == "/tokenize") {
        auto ids = tokenizer_.encode(body.value("prompt", ""));
        return json_answer(200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", 4096}});
      }
      std::vector<int32_t> ids;
      for (const auto& t : body.value("tokens", json::array()))
        if (t.is_number_integer())
          ids.push_back(t.get<int32_t>());
      return json_answer(200, {{sglang ? "text" : "prompt", tokenizer_.decode(ids)}});
    }
    return std::nullopt;
  }

  /// Runs an update: fails or hangs when told to, else loads `dir`.
  /// `load_format`: the request's, else the server's (`--load-format`);
  /// `dummy` fills the weights with random values, as both engines do.
  status update(const std::string& dir, const std::string& load_format = {}) {
    if (hang_updates_ > 0) {
      --hang_updates_;
      for (;;)
        std::this_thread::sleep_for(std::chrono::hours{1});
    }
    if (fail_updates_ > 0) {
      --fail_updates_;
      return make_error(errc::backend_failure, "injected failure loading " + dir);
    }
    std::optional<loaded> current;
    if (dialect_ == "sglang") {
      std::lock_guard lock{mutex_};
      current = model_;
    }
    auto m = load_model(dir, current ? &*current : nullptr);
    if (!m)
      return std::move(m).error();
    if (auto corrupt = corrupt_name(); !corrupt.empty()) {
      // Only when this load gave that tensor.
      auto given = pipeline::open_hf_directory(dir);
      if (given && given->tensors.contains(corrupt) && m->tensors.contains(corrupt)) {
        m->tensors.at(corrupt).bytes.at(0) ^= std::byte{0x01};
        auto w = engine::build_weights(m->config, m->tensors);
        if (!w)
          return std::move(w).error();
        m->weights = std::move(*w);
      }
    }
    if ((load_format.empty() ? load_format_ : load_format) == "dummy") {
      auto noise = engine::random_init(m->config, 977);
      if (!noise)
        return std::move(noise).error();
      auto w = engine::build_weights(m->config, *noise);
      if (!w)
        return std::move(w).error();
      m->weights = std::move(*w);
      m->tensors = std::move(*noise);
    }
    std::lock_guard lock{mutex_};
    model_ = std::move(*m);
    return {};
  }

  std::string corrupt_name() {
    std::lock_guard lock{mutex_};
    return corrupt_tensor_;
  }

  /// SGLang's `/get_weights_by_name` (http_server.py; the model's
  /// get_weights_by_name: `param.cpu().to(torch.float32).numpy().tolist()
  /// [:truncate_size]`, so a matrix is truncated by rows).
  server_response weights_by_name(const json& body) {
    auto failed = [] {
      return json_answer(400, {{"error", {{"message", "Get parameter by name failed"}}}});
    };
    if (no_readback_ || !body.contains("name") || !body["name"].is_string())
      return failed();
    uint64_t truncate = 100;
    if (body.contains("truncate_size") && body["truncate_size"].is_number_unsigned())
      truncate = body["truncate_size"].get<uint64_t>();
    pipeline::host_tensor t;
    {
      std::lock_guard lock{mutex_};
      auto at = model_.tensors.find(body["name"].get<std::string>());
      if (at == model_.tensors.end())
        return failed();
      t = at->second;
    }
    if (t.shape.empty()
        || (t.type != safetensors::dtype::f32 && t.type != safetensors::dtype::bf16))
      return failed();
    auto value = [&](uint64_t i) -> json {
      float v = 0;
      if (t.type == safetensors::dtype::f32) {
        std::memcpy(&v, t.bytes.data() + i * 4, 4);
      } else {
        uint16_t h = 0;
        std::memcpy(&h, t.bytes.data() + i * 2, 2);
        uint32_t bits = uint32_t{h} << 16;
        std::memcpy(&v, &bits, 4);
      }
      if (!std::isfinite(v))
        return nullptr; // orjson writes NaN and infinities as null
      return static_cast<double>(v);
    };
    uint64_t row = 1;
    for (size_t d = 1; d < t.shape.size(); ++d)
      row *= t.shape[d];
    uint64_t rows = std::min<uint64_t>(t.shape[0], truncate);
    // A matrix is its rows' lists (deeper shapes flattened below the first
    // dimension: the adapter counts the numbers, not the nesting).
    json out = json::array();
    for (uint64_t r = 0; r < rows; ++r) {
      if (t.shape.size() == 1) {
        out.push_back(value(r));
        continue;
      }
      json line = json::array();
      for (uint64_t c = 0; c < row; ++c)
        line.push_back(value(r * row + c));
      out.push_back(std::move(line));
    }
    return json_answer(200, out);
  }

  void sglang_control(const server_request& req, http_responder& out) {
    const std::string& path = req.path;
    auto body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return out.send(
        json_answer(400, {{"error", {{"message", "the body is not a JSON object"}}}}));
    if (path == "/pause_generation") {
      std::string mode = body.value("mode", "abort");
      if (mode != "abort" && mode != "retract" && mode != "in_place")
        return out.send(json_answer(400, {{"error", {{"message", "invalid mode " + mode}}}}));
      {
        std::lock_guard lock{mutex_};
        paused_ = true;
      }
      return out.send(
        json_answer(200, {{"message", "Generation paused successfully."}, {"status", "ok"}}));
    }
    if (path == "/continue_generation") {
      {
        std::lock_guard lock{mutex_};
        paused_ = false;
      }
      resumed_.notify_all();
      return out.send(
        json_answer(200, {{"message", "Generation continued successfully."}, {"status", "ok"}}));
    }
    if (path == "/update_weights_from_disk") {
      if (!body.contains("model_path") || !body["model_path"].is_string())
        return out.send(json_answer(400, {{"error", {{"message", "model_path is required"}}}}));
      // UpdateWeightFromDiskReqInput (managers/io_struct.py): `load_format`
      // (none: the server's), `keep_pause` (false: a paused scheduler runs
      // again once the weights are loaded).
      auto ok = update(body["model_path"].get<std::string>(),
                       body.contains("load_format") && body["load_format"].is_string()
                         ? body["load_format"].get<std::string>()
                         : std::string{});
      if (ok && !(body.contains("keep_pause") && body["keep_pause"] == true)) {
        {
          std::lock_guard lock{mutex_};
          paused_ = false;
        }
        resumed_.notify_all();
      }
      if (!ok)
        return out.send(
          json_answer(400, {{"success", false},
                            {"message", "Failed to update weights: " + ok.error().message},
                            {"num_paused_requests", 0}}));
      std::string message = "Succeeded to update model weights.";
      if (body.contains("weight_version") && body["weight_version"].is_string()) {
        std::lock_guard lock{mutex_};
        weight_version_ = body["weight_version"].get<std::string>();
        message += " Weight version updated to " + weight_version_ + ".";
      }
      return out.send(
        json_answer(200, {{"success", true}, {"message", message}, {"num_paused_requests", 0}}));
    }
    if (path == "/model_info" || path == "/get_model_info") {
      if (path == "/model_info" && !new_api_)
        return out.send(json_answer(404, {{"detail", "Not Found"}}));
      std::lock_guard lock{mutex_};
      return out.send(json_answer(200, {{"model_path", model_.path},
                                        {"tokenizer_path", model_.path},
                                        {"is_generation", true},
                                        {"preferred_sampling_params", nullptr},
                                        {"weight_version", weight_version_}}));
    }
    if (path == "/get_weight_version") {
      if (new_api_)
        return out.send(json_answer(
          404, {{"object", "error"},
                {"message", "Endpoint '/get_weight_version' or '/weight_version' is deprecated. "
                            "Please use '/model_info' instead."},
                {"type", "404"},
                {"param", nullptr},
                {"code", 404}}));
      std::lock_guard lock{mutex_};
      return out.send(json_answer(200, {{"weight_version", weight_version_}}));
    }
    if (path == "/get_weights_by_name")
      return out.send(weights_by_name(body));
    if (path == "/flush_cache") {
      server_response r = empty();
      r.body = "Cache flushed.\nPlease check backend logs for more details. (When there are "
               "running or waiting requests, the operation will not be performed.)\n";
      return out.send(std::move(r));
    }
    if (path == "/abort_request")
      return out.send(empty());
    return out.send(json_answer(404, {{"detail", "Not Found"}}));
  }

  void vllm_control(const server_request& req, http_responder& out) {
    const std::string& path = req.path;
    if (path == "/pause") {
      {
        std::lock_guard lock{mutex_};
        paused_ = true;
      }
      return out.send(json_answer(200, {{"status", "paused"}}));
    }
    if (path == "/resume") {
      {
        std::lock_guard lock{mutex_};
        paused_ = false;
      }
      resumed_.notify_all();
      return out.send(json_answer(200, {{"status", "resumed"}}));
    }
    if (path == "/is_paused") {
      std::lock_guard lock{mutex_};
      return out.send(json_answer(200, {{"is_paused", paused_}}));
    }
    if (path == "/reset_prefix_cache")
      return out.send(empty());
    // The weight-version routes (dev/rlhf/api_router.py, 2026); a 2025
    // vLLM (--vllm-2025) has none.
    if (path == "/update_weight_version" && !old_vllm_) {
      auto body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
      if (!body.is_object() || !body.contains("new_version") || !body["new_version"].is_string())
        return out.send(
          json_answer(422, {{"detail", json::array({{{"type", "missing"},
                                                     {"loc", json::array({"body", "new_version"})},
                                                     {"msg", "Field required"}}})}}));
      std::lock_guard lock{mutex_};
      weight_version_ = body["new_version"].get<std::string>();
      ++weight_gen_;
      return out.send(json_answer(200, {{"success", true}, {"new_version", weight_version_}}));
    }
    if (path == "/weight_info" && !old_vllm_) {
      std::lock_guard lock{mutex_};
      return out.send(json_answer(
        200,
        {{"weight_version", weight_version_}, {"weight_gen", weight_gen_}, {"weight_label", ""}}));
    }
    if (path == "/v1/models")
      return out.send(json_answer(
        200, {{"object", "list"},
              {"data",
               json::array({{{"id", model_.path}, {"object", "model"}, {"owned_by", "vllm"}}})}}));
    if (path == "/collective_rpc") {
      auto body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object())
        return out.send(json_answer(400, {{"error",
                                           {{"message", "JSON decode error"},
                                            {"type", "Bad Request"},
                                            {"param", nullptr},
                                            {"code", 400}}}}));
      if (!body.contains("method"))
        return out.send(json_answer(400, {{"error",
                                           {{"message", "Missing 'method' in request body"},
                                            {"type", "Bad Request"},
                                            {"param", nullptr},
                                            {"code", 400}}}}));
      if (body["method"] != "reload_weights") {
        server_response r = empty(500);
        r.body = "Internal Server Error";
        return out.send(std::move(r));
      }
      auto kwargs = body.value("kwargs", json::object());
      std::string dir = kwargs.value("weights_path", model_.path);
      if (auto ok = update(dir); !ok) {
        server_response r = empty(500);
        r.body = "Internal Server Error";
        return out.send(std::move(r));
      }
      return out.send(json_answer(200, {{"results", json::array({nullptr})}}));
    }
    return out.send(json_answer(404, {{"detail", "Not Found"}}));
  }

  /// Keeps the one answer of a request run for a batch's prompt.
  struct collected final : http_responder {
    server_response response;
    void send(server_response r) override { response = std::move(r); }
    void start_events(transport::http_headers) override {}
    void event(std::string) override {}
    void end_events(bool) override {}
    void on_disconnect(std::function<void()>) override {}
    void on_client_close(std::function<void()>) override {}
    uint64_t connection() const override { return 0; }
  };

  /// The text a token prompt stands for (the byte tokenizer; BOS dropped,
  /// and added again by the model's encode).
  std::string text_of(const json& ids) const {
    std::vector<int32_t> v;
    for (const auto& t : ids)
      v.push_back(t.get<int32_t>());
    return tokenizer_.decode(v);
  }

  /// Token prompts and batches as both engines take them (SGLang's
  /// GenerateReqInput `text: str | list[str]`, `input_ids: list[int] |
  /// list[list[int]]`; vLLM's CompletionRequest `prompt: str | list[str] |
  /// list[int] | list[list[int]]`): each prompt is generated alone and the
  /// answers gathered (SGLang: an array; vLLM: one object whose choices
  /// carry their `index`). Streams of batches are not served by this peer.
  /// False when `body` is one text prompt (nothing to do here).
  bool generate_prompts(json body, http_responder& out, engine::api_kind kind) {
    const bool native = kind == engine::api_kind::native;
    const char* key = native ? (body.contains("input_ids") ? "input_ids" : "text") : "prompt";
    if (!body.contains(key) || !body[key].is_array() || body[key].empty())
      return false;
    json prompts = body[key];
    if (prompts[0].is_number_integer())
      prompts = json::array({text_of(prompts)});
    else
      for (auto& p : prompts)
        if (p.is_array())
          p = text_of(p);
    const bool many = body[key][0].is_array() || body[key][0].is_string();
    if (many && body.value("stream", false))
      return out.send(json_answer(400, {{"error", {{"message", "the peer streams no batches"}}}})),
             true;
    json answers = json::array();
    for (size_t i = 0; i < prompts.size(); ++i) {
      json one = body;
      one.erase("input_ids");
      one[native ? "text" : "prompt"] = prompts[i];
      if (native && one.contains("rid") && one["rid"].is_string())
        one["rid"] = one["rid"].get<std::string>() + "_" + std::to_string(i);
      server_request sub;
      sub.body = one.dump();
      collected got;
      generate(sub, got, kind);
      if (got.response.status != 200)
        return out.send(std::move(got.response)), true;
      answers.push_back(json::parse(got.response.body));
    }
    if (native)
      return out.send(json_answer(200, many ? answers : answers[0])), true;
    json merged = answers[0];
    merged["choices"] = json::array();
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < answers.size(); ++i) {
      json c = answers[i]["choices"][0];
      c["index"] = i;
      if (body.value("return_token_ids", false))
        c["prompt_token_ids"] = tokenizer_.encode(prompts[i].get<std::string>());
      merged["choices"].push_back(std::move(c));
      prompt_tokens += answers[i]["usage"].value("prompt_tokens", uint64_t{0});
      completion_tokens += answers[i]["usage"].value("completion_tokens", uint64_t{0});
    }
    merged["usage"] = {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}};
    return out.send(json_answer(200, merged)), true;
  }

  void generate(const server_request& req, http_responder& out, engine::api_kind kind) {
    if (kind != engine::api_kind::chat)
      if (auto doc = json::parse(req.body, nullptr, false);
          doc.is_object() && generate_prompts(std::move(doc), out, kind))
        return;
    auto parsed = engine::parse_api_request(kind, req.body);
    if (!parsed)
      return out.send(json_answer(400, {{"error", {{"message", parsed.error().message}}}}));
    auto body = json::parse(req.body, nullptr, false);
    std::string id = body.is_object() && body.contains("rid") && body["rid"].is_string()
                       ? body["rid"].get<std::string>()
                       : "peer-" + std::to_string(++ids_);
    if (!parsed->seeded)
      parsed->sampling.seed = 1;
    if (garbage_ > 0) {
      --garbage_;
      server_response r;
      r.body = "<html>this is not JSON</html>";
      return out.send(std::move(r));
    }
    auto result = engine::generate([this] { return current(); }, tokenizer_, parsed->prompt,
                                   parsed->sampling, {});
    if (!result)
      return out.send(json_answer(400, {{"error", {{"message", result.error().message}}}}));
    engine::api_output o;
    o.tokens = result->tokens;
    o.logprobs = result->logprobs;
    o.text = result->text;
    o.finish_reason = result->finish_reason;
    o.prompt_tokens = result->prompt_tokens;
    std::string version;
    {
      std::lock_guard lock{mutex_};
      version = weight_version_;
    }
    auto with_version = [&](std::string text) {
      auto j = json::parse(text);
      if (dialect_ != "sglang")
        return j.dump();
      if (j.contains("meta_info"))
        j["meta_info"]["weight_version"] = version;
      else
        j["metadata"] = {{"weight_version", version}};
      return j.dump();
    };
    const int64_t created = 1'700'000'000;
    // vLLM's `return_token_ids`: each choice (each chunk's) carries its ids.
    const bool with_ids =
      dialect_ == "vllm" && body.is_object() && body.value("return_token_ids", false);
    const bool odd = odd_usage_ > 0 && (--odd_usage_, true);
    auto with_ids_of = [&](std::string text, size_t from, size_t to) {
      if (!with_ids)
        return text;
      auto j = json::parse(text);
      if (odd && j.contains("usage"))
        j["usage"] = {{"prompt_tokens", "many"}, {"completion_tokens", -1}};
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        json ids = json::array();
        for (size_t k = from; k < to && k < o.tokens.size(); ++k)
          ids.push_back(o.tokens[k]);
        j["choices"][0]["token_ids"] = std::move(ids);
      }
      return j.dump();
    };
    if (!parsed->stream)
      return out.send(json_answer(
        200, json::parse(with_ids_of(with_version(engine::render_response(*parsed, o, id, created)),
                                     0, o.tokens.size()))));
    out.start_events({});
    std::string so_far;
    size_t i = 0;
    for (; i + 1 < o.text.size(); ++i) {
      std::string delta = o.text.substr(i, 1);
      so_far += delta;
      out.event(
        with_ids_of(engine::render_stream_event(*parsed, id, created, so_far, delta), i, i + 1));
    }
    out.event(with_ids_of(with_version(engine::render_stream_final(
                            *parsed, o, id, created,
                            o.text.empty() ? std::string{} : o.text.substr(o.text.size() - 1))),
                          i, o.tokens.size()));
    out.end_events(true);
  }

  std::string dialect_;
  bool new_api_ = false;
  engine::tokenizer tokenizer_;
  std::mutex mutex_;
  std::condition_variable resumed_;
  loaded model_;
  std::string weight_version_ = "default";
  uint64_t weight_gen_ = 0;
  bool old_vllm_ = false;
  std::string load_format_ = "auto";
  /// `--starting-ms`: how long the server answers 503 to health checks.
  std::chrono::steady_clock::time_point ready_at_;
  bool paused_ = false;
  std::string calls_;
  std::atomic<uint64_t> fail_updates_{0};
  std::string corrupt_tensor_;
  std::atomic<bool> no_readback_{false};
  std::atomic<uint64_t> hang_updates_{0};
  std::atomic<uint64_t> garbage_{0};
  std::atomic<uint64_t> odd_usage_{0};
  std::atomic<uint64_t> ids_{0};
};

} // namespace

/// A crash prints where it happened (the peer is a test tool: its own bugs
/// must be told apart from the adapter's).
void on_crash(int sig) {
  void* frames[64];
  int n = ::backtrace(frames, 64);
  ::dprintf(2, "stitch-engine-peer: signal %d\n", sig);
  ::backtrace_symbols_fd(frames, n, 2);
  ::_exit(128 + sig);
}

int main(int argc, char** argv) {
  std::signal(SIGSEGV, on_crash);
  std::signal(SIGABRT, on_crash);
  std::string dialect = "sglang";
  std::string dir;
  std::string version = "default";
  bool sglang_2026 = false;
  bool vllm_2025 = false;
  std::string load_format = "auto";
  std::chrono::milliseconds starting{0};
  uint16_t port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dialect")
      dialect = next();
    else if (a == "--port")
      port = static_cast<uint16_t>(std::stoi(next()));
    else if (a == "--model-dir")
      dir = next();
    else if (a == "--weight-version")
      version = next();
    else if (a == "--sglang-2026")
      sglang_2026 = true;
    else if (a == "--vllm-2025")
      vllm_2025 = true;
    else if (a == "--load-format")
      load_format = next();
    else if (a == "--starting-ms")
      starting = std::chrono::milliseconds{std::stoll(next())};
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  if ((dialect != "sglang" && dialect != "vllm") || dir.empty()) {
    std::cerr << "usage: stitch-engine-peer --dialect sglang|vllm --port P --model-dir DIR\n";
    return 2;
  }
  // Signals are taken by `sigwait` below, not by the server's threads.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  peer p{dialect, sglang_2026, vllm_2025, load_format, starting};
  if (auto ok = p.boot(dir, version); !ok) {
    std::cerr << "cannot load " << dir << ": " << stitch::to_string(ok.error()) << "\n";
    return 1;
  }
  transport::http_server_options o;
  o.threads = 2;
  transport::http_server server{o, [&p](server_request req, std::shared_ptr<http_responder> out) {
                                  p.handle(std::move(req), std::move(out));
                                }};
  auto bound = server.listen("127.0.0.1", port);
  if (!bound) {
    std::cerr << "cannot listen: " << stitch::to_string(bound.error()) << "\n";
    return 1;
  }
  std::cout << dialect << " peer serving " << dir << " on 127.0.0.1:" << *bound << std::endl;
  int sig = 0;
  sigwait(&set, &sig);
  std::cout << "stopping on signal " << sig << std::endl;
  std::_Exit(0);
}
