// Request bodies of the versioned routes (SGLang /generate, OpenAI
// completions and chat) parse or fail with a message, and what parses
// renders as JSON; an engine's answer body, stamped, stays JSON when it was
// JSON and passes through untouched when it was not.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/engine/api_shapes.hpp"

namespace {

using namespace stitch::engine;

bool is_json(std::string_view text) {
  return !nlohmann::json::parse(text, nullptr, false).is_discarded();
}

} // namespace

// Input: a flags byte (route, what to check), then the body.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  static const char* routes[] = {"/generate", "/v1/completions", "/v1/chat/completions"};
  uint8_t flags = data[0];
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const char* route = routes[(flags & 3) % 3];
  auto kind = api_kind_of(route);
  if (!kind)
    std::abort();

  if (flags & 4) {
    // An engine's answer (an external engine is not trusted to be sane).
    stitch::stamps s{3, 5};
    auto out = stamp_answer(route, body, s, "run");
    if (is_json(body) != is_json(out))
      std::abort();
    if (!is_json(body) && out != body)
      std::abort();
    return 0;
  }

  api_limits limits;
  limits.max_tokens = 4096;
  auto req = parse_api_request(*kind, body, limits);
  if (!req) {
    if (req.error().message.empty())
      std::abort();
    return 0;
  }
  if (req->kind != *kind)
    std::abort();
  api_output out;
  out.tokens = {1, 2, 3};
  out.logprobs = {-0.5f, -1.0f, -0.25f};
  out.text = "abc";
  out.finish_reason = "stop";
  out.prompt_tokens = static_cast<uint32_t>(req->prompt.size());
  out.spans = {{3, 0, 1}, {4, 2, 2}};
  if (!is_json(render_response(*req, out, "id-1", 1)))
    std::abort();
  if (req->stream) {
    if (!is_json(render_stream_event(*req, "id-1", 1, "ab", "b"))
        || !is_json(render_stream_final(*req, out, "id-1", 1, "c")))
      std::abort();
  }
  auto fields = namespace_cache(route, body, "extra_key", "r/weight_v000001");
  if (!is_json(body) && fields != body)
    std::abort();
  return 0;
}
