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
const external_engine::dialect sglang_dialect{"extra_key",
                                              {"/update_weights_from_disk",
                                               "/update_weights_from_tensor",
                                               "/update_weights_from_distributed",
                                               "/update_weights_from_ipc",
                                               "/init_weights_update_group",
                                               "/destroy_weights_update_group",
                                               "/update_weight_version",
                                               "/pause_generation",
                                               "/continue_generation",
                                               "/flush_cache",
                                               "/abort_request",
                                               "/release_memory_occupation",
                                               "/resume_memory_occupation",
                                               "/start_profile",
                                               "/stop_profile",
                                               "/configure_logging",
                                               "/set_internal_state",
                                               "/load_lora_adapter",
                                               "/unload_lora_adapter",
                                               "/shutdown"}};

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
// vLLM keeps no weight version: the reload's answer is the verification, and
// the monitor treats a failed health check as a restart to re-sync after.
// `cache_salt` (chat since 0.9, completions since 0.10) namespaces the cache.
const external_engine::dialect vllm_dialect{
  "cache_salt",
  {"/pause", "/resume", "/is_paused", "/collective_rpc", "/reset_prefix_cache", "/reset_mm_cache",
   "/sleep", "/wake_up", "/is_sleeping", "/update_weights", "/init_weight_transfer",
   "/start_profile", "/stop_profile", "/server_info", "/scale_elastic_ep", "/is_scaling_elastic_ep",
   "/reload", "/get_weight_version", "/update_weight_version"}};

} // namespace stitch::engine::detail
