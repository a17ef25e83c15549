#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/sampler.hpp"

namespace stitch::engine {

/// The request and response shapes of the versioned routes (DESIGN §5):
/// SGLang's native `/generate` and OpenAI's `/v1/completions` and
/// `/v1/chat/completions`, as the built-in engine reads and writes them.
enum class api_kind : uint8_t { native, completions, chat };

/// The kind of a versioned route; nullopt for any other path.
std::optional<api_kind> api_kind_of(std::string_view route);

struct api_request {
  api_kind kind = api_kind::native;
  /// The prompt text (chat messages rendered with the built-in template).
  std::string prompt;
  sampling_options sampling;
  /// False: the engine picks the seed (from the request id).
  bool seeded = false;
  bool return_logprob = false;
  /// SGLang's `return_routed_experts` (mixture-of-experts models).
  bool return_routed_experts = false;
  bool stream = false;
  /// OpenAI `stream_options.include_usage`.
  bool stream_usage = false;
  /// Echoed back in OpenAI responses.
  std::string model;
};

struct api_limits {
  /// `max_new_tokens` / `max_tokens` when the client gives none.
  uint32_t default_max_tokens = 128;
  /// Larger requests are refused (400) rather than truncated.
  uint32_t max_tokens = 1u << 20;
  size_t max_stop_strings = 16;
  size_t max_messages = 4096;
};

/// Parses a body of `kind`. Types and ranges are checked and every error is
/// `invalid_argument` naming the field (`sampling_params.temperature`,
/// `messages[2].content`, ...). Unknown fields are ignored: clients send
/// many that do not apply here (`n` above 1 and `best_of` are refused).
result<api_request> parse_api_request(api_kind kind, std::string_view body,
                                      const api_limits& limits = {});

/// What a generation produced, for rendering.
struct api_output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  /// "stop", "length" or "abort".
  std::string finish_reason;
  uint32_t prompt_tokens = 0;
  /// `weight_version_spans` (rendered when not empty).
  std::vector<version_span> spans;
  /// When routed experts were asked for: `meta_info.routed_experts`, the
  /// experts of every fed position as SGLang returns them — base64 of the
  /// little-endian int32 array `[prompt + completion - 1][layers][k]` (the
  /// last token is never fed) — and `meta_info.routed_experts_version_spans`,
  /// `[{version, first_row, last_row}]`: which version's router chose which
  /// rows. Rendered in `/generate` answers (SGLang's native route).
  std::vector<int32_t> routed_experts;
  std::vector<version_span> routed_spans;
};

/// The complete (non-streamed) response body, without stamps.
std::string render_response(const api_request& req, const api_output& out, std::string_view id,
                            int64_t created);
/// A streamed event before the last: `text_so_far` is the text released so
/// far, `delta` its newest part (SGLang events carry the cumulative text,
/// OpenAI chunks the delta).
std::string render_stream_event(const api_request& req, std::string_view id, int64_t created,
                                std::string_view text_so_far, std::string_view delta);
/// The last streamed event (finish reason, usage; the host adds the stamps).
/// `delta` is the text not released by earlier events.
std::string render_stream_final(const api_request& req, const api_output& out, std::string_view id,
                                int64_t created, std::string_view delta);

/// A versioned route's request body with its prefix-cache namespace `field`
/// (SGLang's `extra_key`, vLLM's `cache_salt`) set to `ns` (the version it
/// is admitted on), composed with the client's own: a string `k` becomes
/// `ns:k`, an array of strings (a batch's, one per prompt) each element so;
/// absent or null, `ns`; any other value is replaced by `ns` (no engine
/// takes it). `ns` holds no `:` (`run/weight_vN`), so two compositions are
/// equal only when both parts are. Bodies that are not JSON objects, and
/// other routes, pass through untouched.
std::string namespace_cache(std::string_view route, std::string_view body, std::string_view field,
                            std::string_view ns);

/// An answer body of a versioned route with the version stamps added
/// (DESIGN §5): in `meta_info` for `/generate` (each element of a batch's
/// array), at the top level for the OpenAI routes. Other bodies (not JSON, an
/// error object, another route) pass through untouched.
std::string stamp_answer(std::string_view route, std::string_view body, const stamps& s,
                         std::string_view run_id);

} // namespace stitch::engine
