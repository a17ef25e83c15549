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
// Clients reach only the routes below (inference and read-only model
// information); every other route, today's control routes and whatever a
// later release adds, answers 403 RouteBlocked at the replica.
namespace {
constexpr std::string_view sglang_server = "sglang python/sglang/srt/entrypoints/http_server.py";
} // namespace

const external_engine::dialect sglang_dialect{
  "extra_key",
  {
    // Read-only model and server information.
    {"GET", "/health", sglang_server},
    {"GET", "/health_generate", sglang_server},
    {"GET", "/model_info", sglang_server},
    {"GET", "/get_model_info", sglang_server},
    {"GET", "/server_info", sglang_server},
    {"GET", "/get_server_info", sglang_server},
    {"GET", "/weight_version", sglang_server},
    {"GET", "/get_weight_version", sglang_server},
    {"GET", "/get_load", sglang_server},
    {"GET", "/metrics", sglang_server},
    {"GET", "/v1/models", sglang_server},
    {"GET", "/v1/models/{}", sglang_server},
    // Inference that is not versioned (no weights are stamped on it).
    {"POST", "/tokenize", sglang_server},
    {"POST", "/detokenize", sglang_server},
    {"POST", "/encode", sglang_server},
    {"POST", "/classify", sglang_server},
    {"POST", "/v1/embeddings", sglang_server},
    {"POST", "/v1/rerank", sglang_server},
    {"POST", "/v1/score", sglang_server},
    {"POST", "/v1/tokenize", sglang_server},
    {"POST", "/v1/detokenize", sglang_server},
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
namespace {
constexpr std::string_view vllm_api = "vllm vllm/entrypoints/openai/api_server.py";
constexpr std::string_view vllm_serve = "vllm vllm/entrypoints/serve/*/api_router.py";
} // namespace

const external_engine::dialect vllm_dialect{"cache_salt",
                                            {
                                              // Read-only model and server information.
                                              {"GET", "/health", vllm_serve},
                                              {"GET", "/load", vllm_serve},
                                              {"GET", "/ping", vllm_serve},
                                              {"GET", "/version", vllm_api},
                                              {"GET", "/metrics", vllm_api},
                                              {"GET", "/v1/models", vllm_api},
                                              // Inference that is not versioned.
                                              {"POST", "/tokenize", vllm_serve},
                                              {"POST", "/detokenize", vllm_serve},
                                              {"POST", "/v1/embeddings", vllm_api},
                                              {"POST", "/pooling", vllm_api},
                                              {"POST", "/classify", vllm_api},
                                              {"POST", "/score", vllm_api},
                                              {"POST", "/v1/score", vllm_api},
                                              {"POST", "/rerank", vllm_api},
                                              {"POST", "/v1/rerank", vllm_api},
                                              {"POST", "/v2/rerank", vllm_api},
                                            }};

} // namespace stitch::engine::detail
