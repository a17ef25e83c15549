// The engines' dialects: what differs between SGLang and vLLM besides their
// update calls (runtime/engine/external_engine_update.cpp).
#include "runtime/engine/external_engine_detail.hpp"

namespace stitch::engine::detail {

// SGLang (python/sglang/srt/entrypoints/http_server.py, managers/io_struct.py;
// fields checked against releases from v0.4.9 to the 2026 main line):
//   POST /pause_generation    {"mode": "in_place"}   (body ignored up to v0.5.5,
//                              which aborts instead: use commit_mode quiesce there)
//   POST /update_weights_from_disk {"model_path", "weight_version",
//                              "abort_all_requests": false, "flush_cache": false}
//                              -> 200/400 {"success", "message", ...}
//   POST /continue_generation {}
//   GET  /model_info, /get_model_info, /get_weight_version -> "weight_version"
//                              (the first that answers 200: 2026 servers answer 404
//                              on /get_weight_version, 2025 ones lack /model_info)
//   POST /flush_cache         (plain text, 200 or 400)
//   POST /abort_request       {"rid"}
//   GET  /health              200 when healthy, 503 while starting
//
// Clients reach only the routes below (read-only model information and the
// inference that generates no sample: a generation elsewhere than the
// versioned routes would go unstamped); every other route, today's control
// routes and whatever a later release adds, answers 403 RouteBlocked at the
// replica. From http_server.py at 3ba38dc0 (2026): `/server_info` and
// `/get_server_info` are left out (they return the server's arguments, its
// API keys among them), as are `/v1/responses`, `/v1/messages`,
// `/invocations`, `/api/*` and `/vertex_generate` (unstamped generations).
// `/health` runs a one-token generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION,
// on by default): 503 while starting, shutting down, or stalled 20 s.
namespace {
constexpr std::string_view sglang_server =
  "sglang python/sglang/srt/entrypoints/http_server.py@3ba38dc0";
constexpr std::string_view sglang_loads =
  "sglang python/sglang/srt/entrypoints/v1_loads.py@0564b521";
} // namespace

const external_engine::dialect sglang_dialect{"extra_key",
                                              {
                                                // Read-only model and server information.
                                                {"GET", "/health", sglang_server},
                                                {"GET", "/health_generate", sglang_server},
                                                {"GET", "/ping", sglang_server},
                                                {"GET", "/model_info", sglang_server},
                                                {"GET", "/get_model_info", sglang_server},
                                                {"GET", "/weight_version", sglang_server},
                                                {"GET", "/get_weight_version", sglang_server},
                                                {"GET", "/get_load", sglang_server},
                                                {"GET", "/v1/loads", sglang_loads},
                                                {"GET", "/metrics", sglang_server},
                                                {"GET", "/v1/models", sglang_server},
                                                {"GET", "/v1/models/{}", sglang_server},
                                                // Inference that generates no sample.
                                                {"POST", "/tokenize", sglang_server},
                                                {"POST", "/detokenize", sglang_server},
                                                {"POST", "/v1/tokenize", sglang_server},
                                                {"POST", "/v1/detokenize", sglang_server},
                                                {"POST", "/encode", sglang_server},
                                                {"POST", "/classify", sglang_server},
                                                {"POST", "/v1/classify", sglang_server},
                                                {"POST", "/v1/embeddings", sglang_server},
                                                {"POST", "/v1/rerank", sglang_server},
                                                {"POST", "/v1/score", sglang_server},
                                              }};

// vLLM 0.16 and later (vllm/entrypoints/serve/{rlhf,rpc,cache}/api_router.py,
// vllm/v1/worker/gpu_worker.py), development mode (VLLM_SERVER_DEV_MODE=1):
//   POST /pause?mode=keep       {"status": "paused"}   (0.12-0.15 ignore `mode` and
//                               abort running requests: use commit_mode quiesce)
//   POST /collective_rpc        {"method": "reload_weights", "kwargs": {"weights_path",
//                               "is_checkpoint_format": true}} -> {"results": [...]}, one
//                               per worker; a failing worker: 500 (before 0.16
//                               reload_weights takes no path: unsupported)
//   POST /resume                {"status": "resumed"}
//   POST /reset_prefix_cache    200, empty (flush_cache)
//   GET  /health                200; 503 once the engine died
//   POST /v1/completions        SGLang's /generate goes here (vllm serve has none):
//                               {prompt, max_tokens, temperature, top_p, top_k, seed,
//                               stop, logprobs: 0, return_token_ids: true (0.10.2+),
//                               cache_salt, stream, stream_options.include_usage}
//   POST /update_weight_version {"new_version"} -> {success, new_version}
//   GET  /weight_info           {weight_version, weight_gen, weight_label}
//                               (vllm/entrypoints/serve/dev/rlhf/api_router.py, 2026: the
//                               version is named after each reload and read back; a vLLM
//                               without them answers 404 and is trusted on its reload)
// `cache_salt` (chat since 0.9, completions since 0.10) namespaces the cache.
// Allowed, as for SGLang (vllm/entrypoints/openai/api_server.py@0001948b
// build_app and the routers it includes): dev-mode routes (`/server_info`,
// `/is_paused`, ...) are left out, as are `/v1/responses`, `/v1/messages`,
// `/invocations`, `/inference/v1/generate` and `/generative_scoring`.
namespace {
constexpr std::string_view vllm_health =
  "vllm vllm/entrypoints/serve/instrumentator/health.py@98b137c6";
constexpr std::string_view vllm_basic =
  "vllm vllm/entrypoints/serve/instrumentator/basic.py@dcbf2004";
constexpr std::string_view vllm_metrics =
  "vllm vllm/entrypoints/serve/instrumentator/metrics.py@ef0feb37";
constexpr std::string_view vllm_sagemaker =
  "vllm vllm/entrypoints/serve/sagemaker/api_router.py@aa4149dc";
constexpr std::string_view vllm_models =
  "vllm vllm/entrypoints/openai/models/api_router.py@ee92a6f3";
constexpr std::string_view vllm_tokenize =
  "vllm vllm/entrypoints/serve/tokenize/api_router.py@b91ee1b4";
constexpr std::string_view vllm_pooling = "vllm vllm/entrypoints/pooling/*/api_router.py@f6e93254";
} // namespace

const external_engine::dialect vllm_dialect{"cache_salt",
                                            {
                                              // Read-only model and server information.
                                              {"GET", "/health", vllm_health},
                                              {"GET", "/load", vllm_basic},
                                              {"GET", "/version", vllm_basic},
                                              {"GET", "/ping", vllm_sagemaker},
                                              {"POST", "/ping", vllm_sagemaker},
                                              {"GET", "/metrics", vllm_metrics},
                                              {"GET", "/v1/models", vllm_models},
                                              {"GET", "/tokenizer_info", vllm_tokenize},
                                              // Inference that generates no sample.
                                              {"POST", "/tokenize", vllm_tokenize},
                                              {"POST", "/detokenize", vllm_tokenize},
                                              {"POST", "/v1/embeddings", vllm_pooling},
                                              {"POST", "/pooling", vllm_pooling},
                                              {"POST", "/classify", vllm_pooling},
                                              {"POST", "/score", vllm_pooling},
                                              {"POST", "/v1/score", vllm_pooling},
                                              {"POST", "/rerank", vllm_pooling},
                                              {"POST", "/v1/rerank", vllm_pooling},
                                              {"POST", "/v2/rerank", vllm_pooling},
                                            }};

} // namespace stitch::engine::detail
