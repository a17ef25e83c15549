// The external engine's requests: translation to the dialect (vLLM serves
// SGLang's /generate through /v1/completions), streams, verification of the
// version that answered.
#include "runtime/engine/external_engine.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "gpu/checksum.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/json_depth.hpp"
#include "runtime/engine/api_shapes.hpp"
#include "runtime/engine/external_engine_detail.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch::engine {

namespace fs = std::filesystem;
using namespace detail;

namespace {

/// A completion choice's logprobs as SGLang's `output_token_logprobs`:
/// `[logprob, token id, null]` per token.
json native_logprobs(const json& c, const json& ids) {
  json lps = json::array();
  if (c.contains("logprobs") && c["logprobs"].is_object()) {
    const json& l = c["logprobs"];
    if (l.contains("token_logprobs") && l["token_logprobs"].is_array())
      for (size_t i = 0; i < l["token_logprobs"].size(); ++i)
        lps.push_back(
          json::array({l["token_logprobs"][i], i < ids.size() ? ids[i] : json(nullptr), nullptr}));
  }
  return lps;
}

/// What a vLLM completion (or its stream so far) says, gathered into
/// SGLang's native answer.
struct native_answer {
  std::string id;
  std::string text;
  json output_ids = json::array();
  json logprobs = json::array();
  std::string finish;
  json usage;
  bool want_logprobs = false;

  /// Takes in one completion object or stream chunk; `delta`: its text and
  /// ids add to what came before (a stream), else they are the whole.
  void take(const json& doc, bool delta) {
    if (doc.contains("id") && doc["id"].is_string())
      id = doc["id"].get<std::string>();
    if (doc.contains("usage") && doc["usage"].is_object())
      usage = doc["usage"];
    if (!doc.contains("choices") || !doc["choices"].is_array() || doc["choices"].empty())
      return;
    const json& c = doc["choices"][0];
    if (!c.is_object())
      return;
    std::string t = c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : "";
    json ids =
      c.contains("token_ids") && c["token_ids"].is_array() ? c["token_ids"] : json::array();
    json lps = native_logprobs(c, ids);
    if (delta) {
      text += t;
      for (auto& x : ids)
        output_ids.push_back(x);
      for (auto& x : lps)
        logprobs.push_back(x);
    } else {
      text = std::move(t);
      output_ids = std::move(ids);
      logprobs = std::move(lps);
    }
    if (c.contains("finish_reason") && c["finish_reason"].is_string())
      finish = c["finish_reason"].get<std::string>();
  }

  /// SGLang's shape: `{text, output_ids, meta_info}` (`finish_reason` null
  /// until the end).
  std::string render(bool last) const {
    json meta;
    meta["id"] = id;
    if (last && !finish.empty())
      meta["finish_reason"] = {{"type", finish}};
    else
      meta["finish_reason"] = nullptr;
    // An engine's garbage must not throw here: counts are taken only when
    // they are counts.
    auto count = [&](const char* key) -> json {
      if (usage.is_object() && usage.contains(key) && usage[key].is_number_unsigned())
        return usage[key];
      return nullptr;
    };
    meta["prompt_tokens"] = count("prompt_tokens");
    meta["completion_tokens"] =
      count("completion_tokens").is_null() ? json(output_ids.size()) : count("completion_tokens");
    if (want_logprobs)
      meta["output_token_logprobs"] = logprobs;
    json out;
    out["text"] = text;
    out["output_ids"] = output_ids;
    out["meta_info"] = std::move(meta);
    return dump(out);
  }
};

} // namespace

namespace {

/// SGLang's `sampling_params` under vLLM's completion names (SGLang
/// python/sglang/srt/sampling/sampling_params.py; vLLM
/// vllm/entrypoints/openai/completion/protocol.py CompletionRequest).
constexpr std::pair<std::string_view, std::string_view> renamed_sampling[] = {
  {"max_new_tokens", "max_tokens"},
  {"min_new_tokens", "min_tokens"},
  {"sampling_seed", "seed"},
  {"no_stop_trim", "include_stop_str_in_output"},
};
constexpr std::string_view same_sampling[] = {"temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "frequency_penalty",
                                              "presence_penalty",
                                              "repetition_penalty",
                                              "stop",
                                              "stop_token_ids",
                                              "ignore_eos",
                                              "skip_special_tokens",
                                              "spaces_between_special_tokens",
                                              "n",
                                              "logit_bias"};
/// SGLang's constrained decoding, as vLLM's `structured_outputs`.
constexpr std::pair<std::string_view, std::string_view> structured_sampling[] = {
  {"json_schema", "json"}, {"regex", "regex"}, {"ebnf", "grammar"}};
/// Request fields that change what SGLang generates and that a vLLM
/// completion cannot carry: refused by name, never dropped.
constexpr std::string_view unserved_fields[] = {"input_embeds",
                                                "image_data",
                                                "video_data",
                                                "audio_data",
                                                "lora_path",
                                                "lora_id",
                                                "custom_logit_processor",
                                                "token_ids_logprob",
                                                "return_hidden_states",
                                                "return_routed_experts",
                                                "session_params",
                                                "return_entropy",
                                                "bootstrap_host",
                                                "bootstrap_port",
                                                "bootstrap_room"};

error unserved(const std::string& field, std::string why) {
  return make_error(errc::invalid_argument, field + ": " + why);
}

/// A token id list: non-negative integers that fit an int32.
bool token_ids(const json& j) {
  return j.is_array() && !j.empty() && std::all_of(j.begin(), j.end(), [](const json& t) {
           return t.is_number_integer() && t.get<int64_t>() >= 0
                  && t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
         });
}

struct completion_call {
  json body;
  /// Several prompts (a batch) or several choices of one: the answer is an array.
  bool many = false;
  bool stream = false;
  bool logprobs = false;
};

/// SGLang's native request (managers/io_struct.py GenerateReqInput) as a
/// vLLM completion: text or token ids, one prompt or a batch, every
/// sampling field under vLLM's name.
result<completion_call> completion_of_native(const json& in) {
  if (!in.is_object())
    return make_error(errc::invalid_argument, "the /generate body must be a JSON object");
  completion_call out;
  json& body = out.body;
  const bool has_text = in.contains("text") && !in["text"].is_null();
  const bool has_ids = in.contains("input_ids") && !in["input_ids"].is_null();
  if (has_text == has_ids)
    return make_error(errc::invalid_argument, has_text ? "give text or input_ids, not both"
                                                       : "text or input_ids is required");
  if (has_text) {
    const json& t = in["text"];
    if (t.is_array() && !t.empty()
        && std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); }))
      out.many = true;
    else if (!t.is_string())
      return unserved("text", "must be a string or a non-empty array of strings");
    body["prompt"] = t;
  } else {
    const json& ids = in["input_ids"];
    if (ids.is_array() && !ids.empty() && ids[0].is_array()) {
      if (!std::all_of(ids.begin(), ids.end(), token_ids))
        return unserved("input_ids", "a batch must be non-empty arrays of token ids");
      out.many = true;
    } else if (!token_ids(ids)) {
      return unserved("input_ids", "must be token ids (non-negative integers) or a batch of them");
    }
    body["prompt"] = ids;
  }
  for (auto field : unserved_fields)
    if (auto it = in.find(std::string{field});
        it != in.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()))
      return unserved(std::string{field}, "vLLM's completions route cannot serve it");
  body["max_tokens"] = 128; // SGLang's default; vLLM's is 16
  if (auto sp = in.find("sampling_params"); sp != in.end() && !sp->is_null()) {
    if (!sp->is_object())
      return unserved("sampling_params", "must be an object");
    for (const auto& [key, value] : sp->items()) {
      if (value.is_null())
        continue;
      bool placed = false;
      for (auto [from, to] : renamed_sampling)
        if (key == from) {
          body[std::string{to}] = value;
          placed = true;
        }
      for (auto name : same_sampling)
        if (key == name) {
          body[key] = value;
          placed = true;
        }
      for (auto [from, to] : structured_sampling)
        if (key == from) {
          body["structured_outputs"][std::string{to}] = value;
          placed = true;
        }
      if (!placed)
        return unserved("sampling_params." + key, "vLLM has no equivalent; it is refused rather "
                                                  "than dropped");
    }
  }
  if (auto n = body.find("n"); n != body.end() && !(n->is_number_integer() && *n == 1))
    out.many = true;
  out.logprobs = in.value("return_logprob", false) == true;
  if (out.logprobs)
    body["logprobs"] = in.contains("top_logprobs_num") && in["top_logprobs_num"].is_number_integer()
                         ? in["top_logprobs_num"]
                         : json(0);
  out.stream = in.contains("stream") && in["stream"] == true;
  if (out.stream) {
    if (out.many)
      return unserved("stream", "a stream of several prompts or choices cannot be served over "
                                "vLLM's completions route; send them one by one or unstreamed");
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  if (in.contains("priority"))
    body["priority"] = in["priority"];
  // The cache namespace Stitch composed (`cache_salt`), with the client's
  // SGLang-style `extra_key` kept inside it.
  if (in.contains("cache_salt"))
    body["cache_salt"] = in["cache_salt"];
  if (auto k = in.find("extra_key"); k != in.end() && k->is_string()) {
    if (body.contains("cache_salt") && body["cache_salt"].is_string())
      body["cache_salt"] = body["cache_salt"].get<std::string>() + ":" + k->get<std::string>();
    else
      body["cache_salt"] = *k;
  }
  body["return_token_ids"] = true;
  return out;
}

/// One vLLM completion choice in SGLang's native shape.
json native_of_choice(const json& c, const std::string& id, const json& usage, bool single,
                      bool logprobs) {
  json item;
  item["text"] = c.contains("text") && c["text"].is_string() ? c["text"] : json("");
  json ids = c.contains("token_ids") && c["token_ids"].is_array() ? c["token_ids"] : json::array();
  item["output_ids"] = ids;
  json meta;
  meta["id"] = id;
  if (c.contains("finish_reason") && c["finish_reason"].is_string())
    meta["finish_reason"] = {{"type", c["finish_reason"]}};
  else
    meta["finish_reason"] = nullptr;
  auto count = [&](const char* key) -> json {
    if (single && usage.is_object() && usage.contains(key) && usage[key].is_number_unsigned())
      return usage[key];
    return nullptr;
  };
  const bool prompt_ids = c.contains("prompt_token_ids") && c["prompt_token_ids"].is_array();
  meta["prompt_tokens"] = prompt_ids ? json(c["prompt_token_ids"].size()) : count("prompt_tokens");
  meta["completion_tokens"] = ids.empty() && !count("completion_tokens").is_null()
                                ? count("completion_tokens")
                                : json(ids.size());
  if (logprobs) {
    meta["output_token_logprobs"] = native_logprobs(c, ids);
  }
  item["meta_info"] = std::move(meta);
  return item;
}

} // namespace

result<engine_reply>
external_engine::generate_over_completions(const engine_call& call, const event_sink& on_event,
                                           const std::function<bool()>& cancelled) {
  // vLLM serves no /generate: SGLang's native request becomes a completion
  // (its prompt, text or token ids, and every sampling field; token ids and
  // logprobs asked for), and the answer (or each stream chunk) SGLang's
  // native shape again.
  json in;
  if (!is_json_object_text(call.body, &in))
    return make_error(errc::invalid_argument, "the /generate body must be a JSON object");
  auto translated = completion_of_native(in);
  if (!translated)
    return std::move(translated).error();
  engine_call sub = call;
  sub.route = "/v1/completions";
  sub.body = dump(translated->body);
  native_answer acc;
  acc.want_logprobs = translated->logprobs;
  event_sink sink;
  if (translated->stream)
    sink = [&](std::string ev) {
      auto doc = json::parse(ev, nullptr, false);
      if (doc.is_discarded() || !doc.is_object() || doc.contains("error")) {
        if (on_event)
          on_event(std::move(ev));
        return;
      }
      acc.take(doc, true);
      if (on_event && doc.contains("choices") && doc["choices"].is_array()
          && !doc["choices"].empty())
        on_event(acc.render(false));
    };
  auto reply = pass_through(sub, sink, cancelled);
  if (!reply || reply->status != 200)
    return reply;
  auto doc = json::parse(reply->body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.contains("error"))
    return reply;
  if (translated->stream) {
    acc.take(doc, reply->stream);
    reply->body = acc.render(true);
    reply->finish_reason = acc.finish;
  } else {
    // Choices in their order (prompt by prompt, each prompt's `n` in turn),
    // as SGLang answers a batch: one object, or an array when many.
    std::vector<const json*> choices;
    if (doc.contains("choices") && doc["choices"].is_array())
      for (const auto& c : doc["choices"])
        if (c.is_object())
          choices.push_back(&c);
    std::stable_sort(choices.begin(), choices.end(), [](const json* a, const json* b) {
      auto index = [](const json* c) {
        return c->contains("index") && (*c)["index"].is_number_unsigned()
                 ? (*c)["index"].get<uint64_t>()
                 : uint64_t{0};
      };
      return index(a) < index(b);
    });
    const std::string id =
      doc.contains("id") && doc["id"].is_string() ? doc["id"].get<std::string>() : call.tag;
    const json usage = doc.contains("usage") ? doc["usage"] : json();
    json out = json::array();
    for (size_t i = 0; i < choices.size(); ++i)
      out.push_back(native_of_choice(*choices[i],
                                     translated->many ? id + "_" + std::to_string(i) : id, usage,
                                     choices.size() == 1, translated->logprobs));
    if (!translated->many) {
      if (out.size() != 1)
        return make_error(errc::engine_unavailable, describe() + " answered one prompt with "
                                                      + std::to_string(out.size())
                                                      + " choices: " + excerpt(reply->body));
      out = out[0];
    }
    reply->body = dump(out);
    reply->finish_reason = finish_reason_of(out);
  }
  reply->content_type = "application/json";
  return reply;
}

result<engine_reply> external_engine::pass_through(const engine_call& call,
                                                   const event_sink& on_event,
                                                   const std::function<bool()>& cancelled) {
  std::set<std::string> accepted;
  {
    std::lock_guard lock{mutex_};
    if (!in_sync_)
      return make_error(errc::engine_unavailable,
                        describe() + " is not serving a verified version"
                          + (last_problem_.empty() ? std::string{} : ": " + last_problem_));
    for (const auto* s : {&committed_, &shadow_})
      if (*s)
        accepted.insert(weight_version_of((*s)->ref));
    // An answer made just before the last commit can arrive just after it.
    if (!previous_version_.empty())
      accepted.insert(previous_version_);
  }
  const bool versioned = api_kind_of(call.route).has_value();
  std::string body = call.body;
  std::string rid;
  bool stream = false;
  // One parse of the body: does it ask for a stream, and (SGLang) a request
  // id of our own, so that a client going away aborts it. SGLang aborts
  // every request whose rid starts with the one given (a batch's items are
  // `<rid>_<i>`): ours end in ':' so that none is the start of another's.
  if (json doc; (versioned || body.find("\"stream\"") != std::string::npos)
                && is_json_object_text(body, &doc)) {
    auto s = doc.find("stream");
    stream = s != doc.end() && s->is_boolean() && s->get<bool>();
    if (versioned && opts_.kind == engine_kind::sglang) {
      if (!doc.contains("rid")) {
        doc["rid"] = "stitch:" + call.tag + ":";
        body = dump(doc);
      }
      if (doc["rid"].is_string())
        rid = doc["rid"].get<std::string>();
    }
  }
  http_request r;
  r.method = call.method;
  r.target = call.route;
  if (!body.empty())
    r.headers.push_back({"Content-Type", "application/json"});
  r.body = body;
  r.cancelled = cancelled;
  engine_reply reply;
  std::optional<std::string> held;
  bool sse = false;
  sse_reader events{[&](std::string data) -> status {
    if (data == "[DONE]")
      return {};
    if (!json_nesting_within(data))
      return make_error(errc::engine_unavailable, describe()
                                                    + " streamed an event nesting JSON "
                                                      "deeper than "
                                                    + std::to_string(max_json_depth) + " levels");
    if (held && on_event)
      on_event(std::move(*held));
    held = std::move(data);
    return {};
  }};
  std::string raw;
  if (stream)
    r.on_body = [&](const http_response& head, std::string_view piece) -> status {
      if (!sse) {
        auto* type = transport::find_header(head.headers, "Content-Type");
        sse = head.status == 200 && type && type->starts_with("text/event-stream");
      }
      if (sse)
        return events.feed(piece);
      if (raw.size() + piece.size() > (size_t{64} << 20))
        return make_error(errc::limit_exceeded,
                          describe() + " answered " + call.route + " with more than 64 MiB");
      raw.append(piece);
      return {};
    };
  auto client = take_client();
  auto answer = client->send(r);
  if (!answer) {
    if (cancelled && cancelled()) {
      if (!rid.empty()) {
        // SGLang aborts a disconnected stream after 2 s; tell it at once.
        auto aborter = take_client();
        auto a = call_json(*aborter, "POST", "/abort_request", dump(json{{"rid", rid}}),
                           opts_.control_timeout, closing_);
        if (a)
          give_client(std::move(aborter));
      }
      return make_error(errc::engine_unavailable, "the caller of " + call.route + " went away");
    }
    monitor_wake_.notify_all();
    auto e = make_error(errc::engine_unavailable,
                        describe() + " " + call.route + ": " + answer.error().message);
    note_problem(e.message);
    return e;
  }
  give_client(std::move(client));
  reply.status = static_cast<uint16_t>(answer->status);
  if (auto* type = transport::find_header(answer->headers, "Content-Type"))
    reply.content_type = *type;
  if (sse) {
    if (auto ok = events.finish(); !ok)
      return std::move(ok).error();
    if (!held) {
      auto e = make_error(errc::engine_unavailable,
                          describe() + " ended its " + call.route + " stream without an event");
      note_problem(e.message);
      return e;
    }
    reply.stream = true;
    reply.content_type = "application/json";
    reply.body = std::move(*held);
  } else {
    reply.body = r.on_body ? std::move(raw) : std::move(answer->body);
  }
  if (!versioned || reply.status != 200)
    return reply;
  if (!json_nesting_within(reply.body)) {
    // Stamping would write it out again: nlohmann's writer recurses.
    auto e = make_error(errc::engine_unavailable, describe() + " answered " + call.route
                                                    + " with JSON nested deeper than "
                                                    + std::to_string(max_json_depth) + " levels");
    note_problem(e.message);
    return e;
  }
  auto doc = json::parse(reply.body, nullptr, false);
  if (doc.is_discarded() || !(doc.is_object() || doc.is_array())) {
    auto e = make_error(errc::engine_unavailable,
                        describe() + " answered " + call.route
                          + " with a body that is not JSON: " + excerpt(reply.body));
    note_problem(e.message);
    return e;
  }
  // The weights that answered must be the ones Stitch activated: stamps
  // never vouch for anything else.
  if (auto v = reported_version(doc); v && !accepted.contains(*v)) {
    auto why = describe() + " answered " + call.route + " with weight_version " + excerpt(*v)
               + ", not the version Stitch activated";
    note_lost(why);
    return make_error(errc::engine_unavailable, why);
  }
  reply.finish_reason = finish_reason_of(doc);
  return reply;
}

result<generation_result> external_engine::generate(const generation_request& request,
                                                    const std::function<bool()>& cancelled) {
  // SGLang's native route for both engines (vLLM's goes through its
  // completions route in `forward`).
  const auto& p = request.sampling;
  json sampling = {{"temperature", p.temperature},
                   {"top_p", p.top_p},
                   {"top_k", p.top_k == 0 ? -1 : static_cast<int64_t>(p.top_k)},
                   {"max_new_tokens", p.max_new_tokens},
                   {"stop", p.stop}};
  if (p.seed)
    sampling["sampling_seed"] = *p.seed;
  engine_call call;
  call.id = request.id;
  call.tag = "gen-" + std::to_string(request.id);
  call.route = "/generate";
  call.body = dump(json{{"text", request.prompt},
                        {"sampling_params", sampling},
                        {"return_logprob", request.return_logprob}});
  auto reply = forward(call, {}, cancelled);
  if (!reply)
    return std::move(reply).error();
  auto doc = json::parse(reply->body, nullptr, false);
  if (reply->status != 200 || !doc.is_object())
    return make_error(errc::engine_unavailable, describe() + " answered " + call.route + " with "
                                                  + std::to_string(reply->status) + ": "
                                                  + excerpt(reply->body));
  generation_result out;
  auto finish = finish_reason_of(doc);
  out.finish = finish == "length"  ? finish_reason::length
               : finish == "abort" ? finish_reason::abort
                                   : finish_reason::stop;
  try {
    out.text = doc.value("text", "");
    for (const auto& id : doc.value("output_ids", json::array()))
      out.tokens.push_back(id.get<int32_t>());
    const auto& meta = doc.at("meta_info");
    out.prompt_tokens = meta.value("prompt_tokens", 0u);
    for (const auto& lp : meta.value("output_token_logprobs", json::array()))
      if (lp.is_array() && !lp.empty() && lp[0].is_number())
        out.logprobs.push_back(lp[0].get<float>());
  } catch (const json::exception& e) {
    return make_error(errc::engine_unavailable, describe() + " answered " + call.route
                                                  + " in an unexpected shape: " + e.what());
  }
  return out;
}

std::string external_engine::stamp_request(std::string_view route, std::string_view body,
                                           const version_ref& served) {
  // The engine's own cache namespace: SGLang's `extra_key`, vLLM's
  // `cache_salt`; entries computed under other weights never match, and a
  // client's own namespace is kept within the version's.
  return namespace_cache(route, body, dialect_->cache_key_field, weight_version_of(served));
}

std::string external_engine::stamp_response(std::string_view route, std::string_view body,
                                            const stamps& s, std::string_view run_id) {
  return stamp_answer(route, body, s, run_id);
}

} // namespace stitch::engine
