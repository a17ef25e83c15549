#include "runtime/engine/api_shapes.hpp"

#include "runtime/core/base64.hpp"
#include "runtime/core/json_depth.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "runtime/engine/tokenizer.hpp"

namespace stitch::engine {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

stitch::error bad(const std::string& field, const std::string& what) {
  return make_error(errc::invalid_argument, field + " " + what);
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

/// A member that is absent or null is nullopt.
const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return nullptr;
  return &*it;
}

result<std::optional<double>> number(const json& obj, const char* key, const std::string& path) {
  const json* v = member(obj, key);
  if (!v)
    return std::optional<double>{};
  if (!v->is_number())
    return bad(path + key, "must be a number");
  double d = v->get<double>();
  if (!std::isfinite(d))
    return bad(path + key, "must be finite");
  return std::optional<double>{d};
}

result<std::optional<int64_t>> integer(const json& obj, const char* key, const std::string& path) {
  const json* v = member(obj, key);
  if (!v)
    return std::optional<int64_t>{};
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return bad(path + key, "is out of range");
    return std::optional<int64_t>{static_cast<int64_t>(v->get<uint64_t>())};
  }
  if (v->is_number_integer())
    return std::optional<int64_t>{v->get<int64_t>()};
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
      return std::optional<int64_t>{static_cast<int64_t>(d)};
  }
  return bad(path + key, "must be an integer");
}

result<bool> flag(const json& obj, const char* key, const std::string& path) {
  const json* v = member(obj, key);
  if (!v)
    return false;
  if (!v->is_boolean())
    return bad(path + key, "must be true or false");
  return v->get<bool>();
}

#define STITCH_TRY(var, expr)                                                                      \
  auto var = (expr);                                                                               \
  if (!var)                                                                                        \
    return std::move(var).error();

/// Sampling fields shared by every shape, read from `obj` (the body, or
/// SGLang's `sampling_params`). `path` prefixes field names in errors.
status read_sampling(const json& obj, const std::string& path, const char* max_tokens_key,
                     const api_limits& limits, api_request& req) {
  STITCH_TRY(temperature, number(obj, "temperature", path));
  if (*temperature) {
    if (**temperature < 0 || **temperature > 100)
      return bad(path + "temperature", "must be in [0, 100]");
    req.sampling.temperature = **temperature;
  }
  STITCH_TRY(top_p, number(obj, "top_p", path));
  if (*top_p) {
    if (**top_p <= 0 || **top_p > 1)
      return bad(path + "top_p", "must be in (0, 1]");
    req.sampling.top_p = **top_p;
  }
  STITCH_TRY(top_k, integer(obj, "top_k", path));
  if (*top_k) {
    // SGLang and vLLM use -1 (and 0) for "no cut".
    if (**top_k < -1 || **top_k > (int64_t{1} << 31))
      return bad(path + "top_k", "must be -1 (off) or a positive integer");
    req.sampling.top_k = **top_k <= 0 ? 0 : static_cast<uint32_t>(**top_k);
  }
  STITCH_TRY(max_tokens, integer(obj, max_tokens_key, path));
  req.sampling.max_tokens = limits.default_max_tokens;
  if (*max_tokens) {
    if (**max_tokens < 0 || **max_tokens > limits.max_tokens)
      return bad(path + max_tokens_key,
                 "must be in [0, " + std::to_string(limits.max_tokens) + "]");
    req.sampling.max_tokens = static_cast<uint32_t>(**max_tokens);
  }
  if (const json* stop = member(obj, "stop")) {
    auto add = [&](const json& s, const std::string& where) -> status {
      if (!s.is_string())
        return bad(where, "must be a string");
      if (s.get_ref<const std::string&>().empty())
        return bad(where, "must not be empty");
      req.sampling.stop.push_back(s.get<std::string>());
      return {};
    };
    if (stop->is_array()) {
      if (stop->size() > limits.max_stop_strings)
        return bad(path + "stop",
                   "has more than " + std::to_string(limits.max_stop_strings) + " strings");
      for (size_t i = 0; i < stop->size(); ++i)
        if (auto ok = add((*stop)[i], path + "stop[" + std::to_string(i) + "]"); !ok)
          return ok;
    } else if (auto ok = add(*stop, path + "stop"); !ok) {
      return ok;
    }
  }
  for (const char* key : {"seed", "sampling_seed"}) {
    STITCH_TRY(seed, integer(obj, key, path));
    if (*seed) {
      req.sampling.seed = static_cast<uint64_t>(**seed);
      req.seeded = true;
    }
  }
  return {};
}

status read_stream(const json& body, api_request& req) {
  STITCH_TRY(stream, flag(body, "stream", ""));
  req.stream = *stream;
  if (const json* opts = member(body, "stream_options")) {
    if (!opts->is_object())
      return bad("stream_options", "must be an object");
    STITCH_TRY(usage, flag(*opts, "include_usage", "stream_options."));
    req.stream_usage = *usage;
  }
  return {};
}

status refuse_many(const json& body) {
  for (const char* key : {"n", "best_of"}) {
    auto n = integer(body, key, "");
    if (!n)
      return std::move(n).error();
    if (*n && **n != 1)
      return bad(key, "must be 1: the built-in engine returns one choice");
  }
  return {};
}

result<std::string> text_content(const json& content, const std::string& where) {
  if (content.is_string())
    return content.get<std::string>();
  if (!content.is_array())
    return bad(where, "must be a string or an array of text parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text")
      return bad(at, "must be a text part ({\"type\":\"text\",\"text\":...})");
    if (!part.contains("text") || !part["text"].is_string())
      return bad(at + ".text", "must be a string");
    out += part["text"].get<std::string>();
  }
  return out;
}

/// The built-in chat template over the byte tokenizer: `<|role|>\ncontent\n`
/// per message, then `<|assistant|>\n`.
result<std::string> chat_prompt(const json& messages, const api_limits& limits) {
  if (!messages.is_array() || messages.empty())
    return bad("messages", "must be a non-empty array");
  if (messages.size() > limits.max_messages)
    return bad("messages", "has more than " + std::to_string(limits.max_messages) + " entries");
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      return bad(at, "must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return bad(at + ".role", "must be a string");
    const auto& role = m["role"].get_ref<const std::string&>();
    if (role.empty() || role.size() > 64)
      return bad(at + ".role", "must be 1 to 64 characters");
    std::string content;
    if (const json* c = member(m, "content")) {
      auto t = text_content(*c, at + ".content");
      if (!t)
        return std::move(t).error();
      content = std::move(*t);
    }
    prompt += "<|" + role + "|>\n" + content + "\n";
  }
  prompt += "<|assistant|>\n";
  return prompt;
}

std::string token_text(int32_t token) {
  if (token == tokenizer::eos)
    return "<|eos|>";
  int32_t one[] = {token};
  return tokenizer{}.decode(one);
}

ordered_json usage_of(const api_output& out) {
  ordered_json u;
  u["prompt_tokens"] = out.prompt_tokens;
  u["completion_tokens"] = out.tokens.size();
  u["total_tokens"] = out.prompt_tokens + out.tokens.size();
  return u;
}

ordered_json native_meta(std::string_view id, const api_output& out, bool finished, bool logprobs) {
  ordered_json meta;
  meta["id"] = id;
  if (finished) {
    ordered_json reason;
    reason["type"] = out.finish_reason;
    meta["finish_reason"] = reason;
  } else {
    meta["finish_reason"] = nullptr;
  }
  meta["prompt_tokens"] = out.prompt_tokens;
  meta["completion_tokens"] = out.tokens.size();
  meta["cached_tokens"] = 0;
  if (logprobs) {
    ordered_json lps = ordered_json::array();
    for (size_t i = 0; i < out.tokens.size() && i < out.logprobs.size(); ++i)
      lps.push_back(ordered_json::array({out.logprobs[i], out.tokens[i], nullptr}));
    meta["output_token_logprobs"] = std::move(lps);
  }
  return meta;
}

ordered_json completion_logprobs(const api_output& out) {
  ordered_json tokens = ordered_json::array(), lps = ordered_json::array(),
               offsets = ordered_json::array();
  size_t offset = 0;
  for (size_t i = 0; i < out.tokens.size() && i < out.logprobs.size(); ++i) {
    auto t = token_text(out.tokens[i]);
    tokens.push_back(t);
    lps.push_back(out.logprobs[i]);
    offsets.push_back(offset);
    if (out.tokens[i] != tokenizer::eos)
      offset += t.size();
  }
  ordered_json l;
  l["tokens"] = std::move(tokens);
  l["token_logprobs"] = std::move(lps);
  l["top_logprobs"] = nullptr;
  l["text_offset"] = std::move(offsets);
  return l;
}

ordered_json chat_logprobs(const api_output& out) {
  ordered_json content = ordered_json::array();
  for (size_t i = 0; i < out.tokens.size() && i < out.logprobs.size(); ++i) {
    ordered_json e;
    auto t = token_text(out.tokens[i]);
    e["token"] = t;
    e["logprob"] = out.logprobs[i];
    ordered_json bytes = ordered_json::array();
    for (unsigned char c : t)
      bytes.push_back(c);
    e["bytes"] = std::move(bytes);
    e["top_logprobs"] = ordered_json::array();
    content.push_back(std::move(e));
  }
  ordered_json l;
  l["content"] = std::move(content);
  return l;
}

ordered_json openai_head(const api_request& req, std::string_view id, int64_t created,
                         const char* object) {
  ordered_json j;
  j["id"] = std::string{req.kind == api_kind::chat ? "chatcmpl-" : "cmpl-"} + std::string{id};
  j["object"] = object;
  j["created"] = created;
  j["model"] = req.model;
  return j;
}

} // namespace

std::optional<api_kind> api_kind_of(std::string_view route) {
  if (route == "/generate")
    return api_kind::native;
  if (route == "/v1/completions")
    return api_kind::completions;
  if (route == "/v1/chat/completions")
    return api_kind::chat;
  return std::nullopt;
}

result<api_request> parse_api_request(api_kind kind, std::string_view body,
                                      const api_limits& limits) {
  if (!json_nesting_within(body))
    return bad("body", "nests JSON deeper than " + std::to_string(max_json_depth) + " levels");
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded())
    return make_error(errc::invalid_argument, "the request body is not valid JSON");
  if (!doc.is_object())
    return make_error(errc::invalid_argument, "the request body must be a JSON object");
  api_request req;
  req.kind = kind;
  req.sampling.temperature = 1.0;
  req.sampling.stop_at_eos = true;
  if (auto ok = read_stream(doc, req); !ok)
    return std::move(ok).error();
  if (const json* model = member(doc, "model")) {
    if (!model->is_string())
      return bad("model", "must be a string");
    req.model = model->get<std::string>();
  }
  switch (kind) {
    case api_kind::native: {
      if (member(doc, "input_ids"))
        return bad("input_ids", "is not supported by the built-in engine: send \"text\"");
      const json* text = member(doc, "text");
      if (!text)
        return bad("text", "is required");
      if (!text->is_string())
        return bad("text", "must be a string (batched prompts are not supported)");
      req.prompt = text->get<std::string>();
      const json* params = member(doc, "sampling_params");
      json none = json::object();
      if (params && !params->is_object())
        return bad("sampling_params", "must be an object");
      if (auto ok = read_sampling(params ? *params : none, "sampling_params.", "max_new_tokens",
                                  limits, req);
          !ok)
        return std::move(ok).error();
      STITCH_TRY(lp, flag(doc, "return_logprob", ""));
      req.return_logprob = *lp;
      STITCH_TRY(routed, flag(doc, "return_routed_experts", ""));
      req.return_routed_experts = *routed;
      break;
    }
    case api_kind::completions: {
      if (auto ok = refuse_many(doc); !ok)
        return std::move(ok).error();
      const json* prompt = member(doc, "prompt");
      if (!prompt)
        return bad("prompt", "is required");
      if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string())
        req.prompt = (*prompt)[0].get<std::string>();
      else if (prompt->is_string())
        req.prompt = prompt->get<std::string>();
      else
        return bad("prompt", "must be a string (batched or token prompts are not supported)");
      if (auto ok = read_sampling(doc, "", "max_tokens", limits, req); !ok)
        return std::move(ok).error();
      STITCH_TRY(lp, integer(doc, "logprobs", ""));
      if (*lp && (**lp < 0 || **lp > 20))
        return bad("logprobs", "must be in [0, 20]");
      req.return_logprob = lp->has_value();
      break;
    }
    case api_kind::chat: {
      if (auto ok = refuse_many(doc); !ok)
        return std::move(ok).error();
      const json* messages = member(doc, "messages");
      if (!messages)
        return bad("messages", "is required");
      STITCH_TRY(prompt, chat_prompt(*messages, limits));
      req.prompt = std::move(*prompt);
      const char* key =
        member(doc, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
      if (auto ok = read_sampling(doc, "", key, limits, req); !ok)
        return std::move(ok).error();
      STITCH_TRY(lp, flag(doc, "logprobs", ""));
      req.return_logprob = *lp;
      break;
    }
  }
  return req;
}

namespace {

ordered_json spans_json(const std::vector<version_span>& spans) {
  ordered_json a = ordered_json::array();
  for (const auto& s : spans)
    a.push_back(ordered_json{
      {"version", s.version}, {"first_token", s.first_token}, {"last_token", s.last_token}});
  return a;
}

/// SGLang's `routed_experts`: base64 of the little-endian int32 ids
/// (python/sglang/srt/managers/tokenizer_manager.py encodes the tensor's
/// bytes; layers/moe/routed_experts_capturer.py gives its shape).
std::string routed_experts_base64(const std::vector<int32_t>& ids) {
  std::string bytes(ids.size() * 4, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto v = static_cast<uint32_t>(ids[i]);
    for (size_t b = 0; b < 4; ++b)
      bytes[i * 4 + b] = static_cast<char>((v >> (8 * b)) & 0xFF);
  }
  return base64_encode(bytes);
}

ordered_json native_body(const api_request& req, const api_output& out, std::string_view id) {
  ordered_json j;
  j["text"] = out.text;
  j["output_ids"] = out.tokens;
  j["meta_info"] = native_meta(id, out, true, req.return_logprob);
  if (!out.spans.empty())
    j["meta_info"]["weight_version_spans"] = spans_json(out.spans);
  if (req.return_routed_experts) {
    j["meta_info"]["routed_experts"] = routed_experts_base64(out.routed_experts);
    ordered_json rows = ordered_json::array();
    for (const auto& s : out.routed_spans)
      rows.push_back(ordered_json{
        {"version", s.version}, {"first_row", s.first_token}, {"last_row", s.last_token}});
    j["meta_info"]["routed_experts_version_spans"] = std::move(rows);
  }
  return j;
}

/// An OpenAI completion or chunk with one choice. `out` is null for a chunk
/// before the last (no logprobs, no finish reason yet).
ordered_json openai_body(const api_request& req, const api_output* out, std::string_view id,
                         int64_t created, bool chunk, std::string_view text, bool with_role,
                         bool usage) {
  bool chat = req.kind == api_kind::chat;
  const char* object =
    chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  ordered_json j = openai_head(req, id, created, object);
  ordered_json choice;
  choice["index"] = 0;
  if (chat) {
    ordered_json m;
    if (!chunk || with_role)
      m["role"] = "assistant";
    m["content"] = text;
    choice[chunk ? "delta" : "message"] = std::move(m);
  } else {
    choice["text"] = text;
  }
  bool logprobs = out && req.return_logprob;
  choice["logprobs"] = !logprobs ? ordered_json(nullptr)
                       : chat    ? chat_logprobs(*out)
                                 : completion_logprobs(*out);
  choice["finish_reason"] = out ? ordered_json(out->finish_reason) : ordered_json(nullptr);
  j["choices"] = ordered_json::array({std::move(choice)});
  if (usage && out)
    j["usage"] = usage_of(*out);
  if (out && !out->spans.empty())
    j["weight_version_spans"] = spans_json(out->spans);
  return j;
}

} // namespace

std::string render_response(const api_request& req, const api_output& out, std::string_view id,
                            int64_t created) {
  if (req.kind == api_kind::native)
    return dump(native_body(req, out, id));
  return dump(openai_body(req, &out, id, created, false, out.text, true, true));
}

std::string render_stream_event(const api_request& req, std::string_view id, int64_t created,
                                std::string_view text_so_far, std::string_view delta) {
  if (req.kind == api_kind::native) {
    ordered_json j;
    j["text"] = text_so_far;
    ordered_json meta;
    meta["id"] = id;
    meta["finish_reason"] = nullptr;
    j["meta_info"] = std::move(meta);
    return dump(j);
  }
  return dump(
    openai_body(req, nullptr, id, created, true, delta, text_so_far.size() == delta.size(), false));
}

std::string render_stream_final(const api_request& req, const api_output& out, std::string_view id,
                                int64_t created, std::string_view delta) {
  if (req.kind == api_kind::native)
    return dump(native_body(req, out, id));
  return dump(openai_body(req, &out, id, created, true, delta, false, req.stream_usage));
}

std::string namespace_cache(std::string_view route, std::string_view body, std::string_view field,
                            std::string_view ns) {
  if (!api_kind_of(route) || !json_nesting_within(body))
    return std::string{body};
  auto doc = ordered_json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return std::string{body};
  const std::string prefix = std::string{ns} + ":";
  auto& slot = doc[std::string{field}];
  auto all_strings = [](const ordered_json& a) {
    return std::all_of(a.begin(), a.end(), [](const ordered_json& x) { return x.is_string(); });
  };
  if (slot.is_string())
    slot = prefix + slot.get<std::string>();
  else if (slot.is_array() && !slot.empty() && all_strings(slot))
    for (auto& k : slot)
      k = prefix + k.get<std::string>();
  else
    slot = std::string{ns};
  return dump(doc);
}

namespace {

/// Span versions within the stamps, neighbours of one version merged: an
/// exact pin whose version advanced under it (equal weights, see
/// `engine_port::relabel`) says its pin for every token, as its stamps do.
void clamp_spans(ordered_json& holder, const stamps& s, const char* key = "weight_version_spans",
                 const char* last_key = "last_token") {
  auto it = holder.find(key);
  if (it == holder.end() || !it->is_array())
    return;
  ordered_json out = ordered_json::array();
  for (auto& span : *it) {
    if (!span.is_object() || !span["version"].is_number_unsigned()) {
      out.push_back(span);
      continue;
    }
    auto v = std::clamp(span["version"].get<uint64_t>(), s.start, s.end);
    span["version"] = v;
    if (!out.empty() && out.back().is_object() && out.back()["version"] == v
        && span.contains(last_key))
      out.back()[last_key] = span[last_key];
    else
      out.push_back(span);
  }
  *it = std::move(out);
}

void stamp_native(ordered_json& doc, const stamps& s, std::string_view run_id) {
  auto& meta = doc["meta_info"];
  if (!meta.is_object())
    meta = ordered_json::object();
  clamp_spans(meta, s);
  clamp_spans(meta, s, "routed_experts_version_spans", "last_row");
  meta["weight_version_start"] = s.start;
  meta["weight_version_end"] = s.end;
  meta["weight_version"] = std::to_string(s.start);
  meta["run_id"] = run_id;
}

} // namespace

std::string stamp_answer(std::string_view route, std::string_view body, const stamps& s,
                         std::string_view run_id) {
  auto kind = api_kind_of(route);
  if (!kind || !json_nesting_within(body))
    return std::string{body};
  auto doc = ordered_json::parse(body, nullptr, false);
  if (doc.is_discarded())
    return std::string{body};
  if (*kind == api_kind::native && doc.is_array()) {
    // A batch: every element is one prompt's answer.
    for (auto& item : doc)
      if (item.is_object() && !item.contains("error"))
        stamp_native(item, s, run_id);
    return dump(doc);
  }
  if (!doc.is_object() || doc.contains("error"))
    return std::string{body};
  if (*kind == api_kind::native) {
    stamp_native(doc, s, run_id);
  } else {
    clamp_spans(doc, s);
    doc["weight_version_start"] = s.start;
    doc["weight_version_end"] = s.end;
    doc["run_id"] = run_id;
  }
  return dump(doc);
}

} // namespace stitch::engine
