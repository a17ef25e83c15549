#pragma once

// What the external engine's files share (runtime/engine/external_engine*.cpp):
// the dialect tables, the JSON and server-sent-event helpers, the control
// call. Not a public header: only those files include it.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/engine_routes.hpp"
#include "runtime/core/json_depth.hpp"
#include "runtime/engine/external_engine.hpp"

namespace stitch::engine {

/// What differs between engines besides their update calls: the request
/// field that namespaces the prefix cache, the routes clients may reach
/// (inference and read-only model information; every other route is the
/// engine's control and refused). Each route names the engine source it
/// follows.
struct external_engine::dialect {
  std::string cache_key_field;
  std::vector<engine_route> allowed;
};

namespace detail {

using json = nlohmann::json;
using transport::http_request;
using transport::http_response;

/// The two dialects (`external_dialects.cpp`, with the engine sources each
/// route follows).
extern const external_engine::dialect sglang_dialect;
extern const external_engine::dialect vllm_dialect;

inline std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// A short, printable excerpt of an engine's answer for an error message.
inline std::string excerpt(std::string_view body) {
  return quote_untrusted(body, 200);
}

/// A JSON POST (or GET with an empty body) through `client`.
inline result<http_response> call_json(transport::http_client& client, std::string method,
                                       std::string target, const std::string& body,
                                       std::chrono::milliseconds timeout,
                                       const std::function<bool()>& cancelled = {}) {
  http_request r;
  r.cancelled = cancelled;
  r.method = std::move(method);
  r.target = std::move(target);
  if (!body.empty() || r.method == "POST")
    r.headers.push_back({"Content-Type", "application/json"});
  r.body = body;
  r.io_timeout = timeout;
  return client.send(r);
}

/// Both engines answer GET /health 200 when they can serve.
inline constexpr const char* health_route = "/health";

inline bool is_json_object_text(std::string_view body, json* out = nullptr) {
  if (!json_nesting_within(body))
    return false;
  auto doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return false;
  if (out)
    *out = std::move(doc);
  return true;
}

/// Splits server-sent events as their bytes arrive; each complete event's
/// `data` (lines joined) goes to `on_data`.
class sse_reader {
public:
  explicit sse_reader(std::function<status(std::string data)> on_data)
      : on_data_(std::move(on_data)) {}

  status feed(std::string_view bytes) {
    pending_.append(bytes);
    for (;;) {
      auto end = pending_.find("\n\n");
      size_t skip = 2;
      if (auto crlf = pending_.find("\r\n\r\n"); crlf != std::string::npos && crlf < end) {
        end = crlf;
        skip = 4;
      }
      if (end == std::string::npos)
        break;
      std::string block = pending_.substr(0, end);
      pending_.erase(0, end + skip);
      if (auto ok = event(block); !ok)
        return ok;
    }
    if (pending_.size() > (size_t{64} << 20))
      return make_error(errc::limit_exceeded, "an event of the engine's stream is over 64 MiB");
    return {};
  }

  status finish() {
    if (pending_.find_first_not_of("\r\n") == std::string::npos)
      return {};
    std::string block = std::move(pending_);
    pending_.clear();
    return event(block);
  }

private:
  status event(std::string_view block) {
    std::string data;
    bool any = false;
    while (!block.empty()) {
      auto nl = block.find('\n');
      auto line = block.substr(0, nl);
      if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
      if (line.starts_with("data:")) {
        line.remove_prefix(5);
        if (line.starts_with(' '))
          line.remove_prefix(1);
        if (any)
          data += '\n';
        data += line;
        any = true;
      }
      block = nl == std::string_view::npos ? std::string_view{} : block.substr(nl + 1);
    }
    if (!any)
      return {};
    return on_data_(std::move(data));
  }

  std::function<status(std::string)> on_data_;
  std::string pending_;
};

/// The answer object of a versioned route: the last item of a batch.
inline const json* answer_item(const json& doc) {
  const json* item = doc.is_array() ? (doc.empty() ? nullptr : &doc.back()) : &doc;
  return item && item->is_object() ? item : nullptr;
}

/// "stop", "length" or "abort" from an answer of a versioned route, or empty.
inline std::string finish_reason_of(const json& doc) {
  const json* item = answer_item(doc);
  if (!item)
    return {};
  if (auto meta = item->find("meta_info"); meta != item->end() && meta->is_object()) {
    auto f = meta->find("finish_reason");
    if (f != meta->end() && f->is_object() && f->contains("type") && (*f)["type"].is_string())
      return (*f)["type"].get<std::string>();
    return {};
  }
  if (auto choices = item->find("choices");
      choices != item->end() && choices->is_array() && !choices->empty()) {
    const auto& c = choices->back();
    if (c.is_object() && c.contains("finish_reason") && c["finish_reason"].is_string())
      return c["finish_reason"].get<std::string>();
  }
  return {};
}

/// The `weight_version` an SGLang answer reports (`meta_info` of the native
/// route, `metadata` of the OpenAI ones), if any.
inline std::optional<std::string> reported_version(const json& doc) {
  const json* item = answer_item(doc);
  if (!item)
    return std::nullopt;
  for (const char* holder : {"meta_info", "metadata"}) {
    auto h = item->find(holder);
    if (h != item->end() && h->is_object()) {
      auto v = h->find("weight_version");
      if (v != h->end() && v->is_string())
        return v->get<std::string>();
    }
  }
  return std::nullopt;
}

/// config.json keys that do not change how weights are used.
inline bool cosmetic_config_key(std::string_view key) {
  return key == "_name_or_path" || key == "transformers_version" || key == "torch_dtype"
         || key == "dtype" || key == "use_cache";
}

/// The first architecture setting two config.json texts disagree on, or empty.
inline std::string config_difference(std::string_view served, std::string_view next) {
  if (!json_nesting_within(next) || !json_nesting_within(served))
    return "config.json nests JSON deeper than " + std::to_string(max_json_depth) + " levels";
  auto a = json::parse(served, nullptr, false);
  auto b = json::parse(next, nullptr, false);
  if (a.is_discarded() || !a.is_object())
    return "the served config.json is not a JSON object";
  if (b.is_discarded() || !b.is_object())
    return "config.json is not a JSON object";
  std::set<std::string> keys;
  for (const auto& [k, v] : a.items())
    keys.insert(k);
  for (const auto& [k, v] : b.items())
    keys.insert(k);
  for (const auto& k : keys) {
    if (cosmetic_config_key(k))
      continue;
    auto x = a.find(k);
    auto y = b.find(k);
    bool same = x != a.end() && y != b.end() && *x == *y;
    if (!same)
      return "'" + k + "' is " + (y == b.end() ? std::string{"absent"} : excerpt(dump(*y)))
             + " instead of " + (x == a.end() ? std::string{"absent"} : excerpt(dump(*x)));
  }
  return {};
}

/// The staging folder name of a version: `<run>@v<version>`.
inline std::string folder_of(const version_ref& ref) {
  std::string run;
  for (char c : ref.run_id)
    run +=
      (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return run + "@" + version_dir_name(ref.version);
}

/// `weight_version` as the engine reports it now.
inline result<std::string> sglang_served_version(transport::http_client& c,
                                                 std::chrono::milliseconds timeout,
                                                 const std::function<bool()>& cancelled) {
  std::string tried;
  for (const char* route : {"/model_info", "/get_model_info", "/get_weight_version"}) {
    auto r = call_json(c, "GET", route, {}, timeout, cancelled);
    if (!r)
      return std::move(r).error();
    json doc;
    if (r->status == 200 && is_json_object_text(r->body, &doc) && doc.contains("weight_version")
        && doc["weight_version"].is_string())
      return doc["weight_version"].get<std::string>();
    tried +=
      std::string{tried.empty() ? "" : ", "} + route + " answered " + std::to_string(r->status);
  }
  return make_error(errc::engine_unavailable,
                    "the engine reports no weight_version (" + tried + ")");
}

/// What a vLLM reports through its weight-version routes
/// (vllm/entrypoints/serve/dev/rlhf/api_router.py, 2026: `GET /weight_info`
/// -> {"weight_version", "weight_gen", "weight_label"}): the version (empty
/// while it has none); a vLLM without the route (404) is an error.
inline result<std::string> vllm_served_version(transport::http_client& c,
                                               std::chrono::milliseconds timeout,
                                               const std::function<bool()>& cancelled) {
  auto r = call_json(c, "GET", "/weight_info", {}, timeout, cancelled);
  if (!r)
    return std::move(r).error();
  json doc;
  if (r->status != 200 || !is_json_object_text(r->body, &doc) || !doc.contains("weight_version"))
    return make_error(errc::engine_unavailable, "/weight_info answered " + std::to_string(r->status)
                                                  + ": " + excerpt(r->body));
  const json& v = doc["weight_version"];
  if (!v.is_null() && !v.is_string())
    return make_error(errc::engine_unavailable,
                      "/weight_info answered a weight_version that is not a string: "
                        + excerpt(r->body));
  return v.is_string() ? v.get<std::string>() : std::string{};
}

} // namespace detail
} // namespace stitch::engine
