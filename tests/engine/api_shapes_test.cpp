#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "runtime/engine/api_shapes.hpp"

namespace stitch::engine {
namespace {

using json = nlohmann::json;

std::string error_of(api_kind kind, std::string_view body) {
  auto r = parse_api_request(kind, body);
  if (r)
    return "(parsed)";
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  return r.error().message;
}

TEST(api_shapes, routes) {
  EXPECT_EQ(api_kind_of("/generate"), api_kind::native);
  EXPECT_EQ(api_kind_of("/v1/completions"), api_kind::completions);
  EXPECT_EQ(api_kind_of("/v1/chat/completions"), api_kind::chat);
  EXPECT_FALSE(api_kind_of("/v1/models"));
  EXPECT_FALSE(api_kind_of("/generate/"));
}

TEST(api_shapes, native_request_reads_sampling_params) {
  auto r = parse_api_request(api_kind::native, R"({"text":"hi","sampling_params":{
    "temperature":0.5,"top_p":0.9,"top_k":-1,"max_new_tokens":7,"stop":["\n","END"],
    "sampling_seed":11},"return_logprob":true,"stream":true,"extra_key":"x"})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->prompt, "hi");
  EXPECT_DOUBLE_EQ(r->sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r->sampling.top_p, 0.9);
  EXPECT_EQ(r->sampling.top_k, 0u);
  EXPECT_EQ(r->sampling.max_tokens, 7u);
  EXPECT_EQ(r->sampling.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r->seeded);
  EXPECT_EQ(r->sampling.seed, 11u);
  EXPECT_TRUE(r->return_logprob);
  EXPECT_TRUE(r->stream);
}

TEST(api_shapes, defaults_when_fields_are_absent_or_null) {
  auto r = parse_api_request(api_kind::completions,
                             R"({"prompt":"x","temperature":null,"max_tokens":null,"stop":null})");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->sampling.temperature, 1.0);
  EXPECT_EQ(r->sampling.max_tokens, 128u);
  EXPECT_TRUE(r->sampling.stop.empty());
  EXPECT_FALSE(r->seeded);
  EXPECT_FALSE(r->return_logprob);
}

TEST(api_shapes, errors_name_the_field) {
  EXPECT_EQ(error_of(api_kind::native, "{"), "the request body is not valid JSON");
  EXPECT_EQ(error_of(api_kind::native, "[1]"), "the request body must be a JSON object");
  EXPECT_EQ(error_of(api_kind::native, R"({})"), "text is required");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":"a","sampling_params":{"temperature":"hot"}})"),
            "sampling_params.temperature must be a number");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":"a","sampling_params":{"top_p":0}})"),
            "sampling_params.top_p must be in (0, 1]");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":"a","sampling_params":{"max_new_tokens":-1}})"),
            "sampling_params.max_new_tokens must be in [0, 1048576]");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":"a","sampling_params":{"max_new_tokens":1.5}})"),
            "sampling_params.max_new_tokens must be an integer");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":["a","b"]})"),
            "text must be a string (batched prompts are not supported)");
  EXPECT_EQ(error_of(api_kind::native, R"({"text":"a","sampling_params":{"stop":["a",""]}})"),
            "sampling_params.stop[1] must not be empty");
  EXPECT_EQ(error_of(api_kind::completions, R"({"prompt":"a","n":2})"),
            "n must be 1: the built-in engine returns one choice");
  EXPECT_EQ(error_of(api_kind::completions, R"({"prompt":"a","logprobs":99})"),
            "logprobs must be in [0, 20]");
  EXPECT_EQ(error_of(api_kind::completions, R"({"prompt":"a","stream":"yes"})"),
            "stream must be true or false");
  EXPECT_EQ(error_of(api_kind::chat, R"({"messages":[]})"), "messages must be a non-empty array");
  EXPECT_EQ(error_of(api_kind::chat, R"({"messages":[{"role":"user","content":5}]})"),
            "messages[0].content must be a string or an array of text parts");
  EXPECT_EQ(error_of(api_kind::chat, R"({"messages":[{"content":"x"}]})"),
            "messages[0].role must be a string");
  EXPECT_EQ(error_of(api_kind::completions, R"({"prompt":"a","seed":1e300})"),
            "seed must be an integer");
}

TEST(api_shapes, chat_messages_render_with_the_builtin_template) {
  auto r = parse_api_request(api_kind::chat,
                             R"({"messages":[{"role":"system","content":"be brief"},
                    {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
        "max_completion_tokens":3,"logprobs":true})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->prompt, "<|system|>\nbe brief\n<|user|>\nhi there\n<|assistant|>\n");
  EXPECT_EQ(r->sampling.max_tokens, 3u);
  EXPECT_TRUE(r->return_logprob);
}

api_output sample_output() {
  api_output o;
  o.tokens = {104, 105, 257};
  o.logprobs = {-0.5F, -1.25F, -2.0F};
  o.text = "hi";
  o.finish_reason = "stop";
  o.prompt_tokens = 4;
  return o;
}

TEST(api_shapes, native_response_has_sglang_fields) {
  api_request req;
  req.kind = api_kind::native;
  req.return_logprob = true;
  auto j = json::parse(render_response(req, sample_output(), "abc", 1));
  EXPECT_EQ(j["text"], "hi");
  EXPECT_EQ(j["output_ids"], json::array({104, 105, 257}));
  EXPECT_EQ(j["meta_info"]["id"], "abc");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(j["meta_info"]["prompt_tokens"], 4);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 3);
  ASSERT_EQ(j["meta_info"]["output_token_logprobs"].size(), 3u);
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"][1][0], -1.25);
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"][1][1], 105);
}

TEST(api_shapes, openai_responses_have_choices_usage_and_logprobs) {
  api_request req;
  req.kind = api_kind::completions;
  req.model = "m";
  req.return_logprob = true;
  auto c = json::parse(render_response(req, sample_output(), "7", 1700000000));
  EXPECT_EQ(c["id"], "cmpl-7");
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["created"], 1700000000);
  EXPECT_EQ(c["model"], "m");
  EXPECT_EQ(c["choices"][0]["text"], "hi");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], json::array({"h", "i", "<|eos|>"}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["token_logprobs"][0], -0.5);
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], json::array({0, 1, 2}));
  EXPECT_EQ(c["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(c["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c["usage"]["total_tokens"], 7);

  req.kind = api_kind::chat;
  auto ch = json::parse(render_response(req, sample_output(), "7", 1));
  EXPECT_EQ(ch["id"], "chatcmpl-7");
  EXPECT_EQ(ch["object"], "chat.completion");
  EXPECT_EQ(ch["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(ch["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(ch["choices"][0]["logprobs"]["content"][0]["token"], "h");
  EXPECT_EQ(ch["choices"][0]["logprobs"]["content"][0]["bytes"], json::array({104}));
  req.return_logprob = false;
  EXPECT_TRUE(
    json::parse(render_response(req, sample_output(), "7", 1))["choices"][0]["logprobs"].is_null());
}

TEST(api_shapes, stream_events) {
  api_request req;
  req.kind = api_kind::chat;
  auto first = json::parse(render_stream_event(req, "1", 1, "h", "h"));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "h");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  auto next = json::parse(render_stream_event(req, "1", 1, "hi", "i"));
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  req.stream_usage = true;
  auto last = json::parse(render_stream_final(req, sample_output(), "1", 1, ""));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["usage"]["total_tokens"], 7);
  req.kind = api_kind::native;
  auto native = json::parse(render_stream_event(req, "1", 1, "hi", "i"));
  EXPECT_EQ(native["text"], "hi") << "SGLang events carry the cumulative text";
}

TEST(api_shapes, hostile_bytes_never_throw) {
  api_request req;
  req.kind = api_kind::completions;
  api_output o = sample_output();
  o.text = "\xff\xfe\xc3";
  o.tokens = {255, 254};
  EXPECT_NO_THROW(json::parse(render_response(req, o, "\xff", 1)));
}

TEST(api_shapes, mutated_bodies_never_throw_and_errors_say_why) {
  const std::string seeds[] = {
    R"({"text":"hi","sampling_params":{"temperature":0.5,"stop":["a"],"max_new_tokens":3}})",
    R"({"prompt":["x"],"max_tokens":2,"logprobs":1,"stream":true,"stream_options":{"include_usage":true}})",
    R"({"messages":[{"role":"user","content":[{"type":"text","text":"t"}]}],"n":1})"};
  std::mt19937_64 rng{7};
  std::string alphabet = "{}[]\":,0123456789.-+eEtruefalsn \\";
  alphabet += '\0';
  alphabet += '\xff';
  size_t parsed = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string body = seeds[static_cast<size_t>(round) % 3];
    for (int edits = 1 + static_cast<int>(rng() % 4); edits > 0; --edits) {
      size_t at = rng() % (body.size() + 1);
      switch (rng() % 3) {
        case 0: body.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 1:
          if (at < body.size())
            body.erase(at, 1);
          break;
        default:
          if (at < body.size())
            body[at] = alphabet[rng() % alphabet.size()];
      }
    }
    for (auto kind : {api_kind::native, api_kind::completions, api_kind::chat}) {
      result<api_request> r = make_error(errc::invalid_argument, "unset");
      ASSERT_NO_THROW(r = parse_api_request(kind, body)) << body;
      if (r) {
        ++parsed;
        api_output o;
        o.text = r->prompt;
        o.finish_reason = "stop";
        ASSERT_NO_THROW(json::parse(render_response(*r, o, "id", 1)));
      } else {
        EXPECT_FALSE(r.error().message.empty());
      }
    }
  }
  EXPECT_GT(parsed, 0u);
}

} // namespace
TEST(api_shapes, bodies_nesting_too_deep_are_refused_and_never_rewritten) {
  std::string deep =
    R"({"text":"hi","x":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  auto req = parse_api_request(api_kind::native, deep);
  ASSERT_FALSE(req);
  EXPECT_NE(req.error().message.find("deeper than 64"), std::string::npos) << req.error().message;
  // Rewriting would write it out again (a recursion as deep): untouched.
  EXPECT_EQ(namespace_cache("/generate", deep, "extra_key", "k"), deep);
  EXPECT_EQ(stamp_answer("/generate", deep, {1, 1}, "r"), deep);
}

} // namespace stitch::engine

namespace stitch::engine {

TEST(api_shapes, stamping_keeps_the_spans_within_the_stamps) {
  // An exact pin of 5 whose version advanced to 6 under it (equal weights):
  // the engine counted its last tokens as 6; the answer says 5 throughout.
  std::string native =
    R"({"text":"ab","meta_info":{"weight_version_spans":[{"version":5,"first_token":0,)"
    R"("last_token":1},{"version":6,"first_token":2,"last_token":3}]}})";
  auto stamped = nlohmann::json::parse(stamp_answer("/generate", native, {5, 5}, "r"));
  EXPECT_EQ(stamped["meta_info"]["weight_version_spans"],
            nlohmann::json::parse(R"([{"version":5,"first_token":0,"last_token":3}])"));
  EXPECT_EQ(stamped["meta_info"]["weight_version_end"], 5);
  // Within the stamps nothing changes (OpenAI's shape: at the top level).
  std::string openai =
    R"({"choices":[],"weight_version_spans":[{"version":5,"first_token":0,"last_token":1},)"
    R"({"version":6,"first_token":2,"last_token":3}]})";
  auto crossing = nlohmann::json::parse(stamp_answer("/v1/completions", openai, {5, 6}, "r"));
  EXPECT_EQ(crossing["weight_version_spans"],
            nlohmann::json::parse(openai)["weight_version_spans"]);
}

} // namespace stitch::engine

namespace stitch::engine {
namespace {

TEST(api_shapes, routed_experts_are_asked_for_rendered_in_meta_info_and_their_spans_stamped) {
  auto req = parse_api_request(api_kind::native, R"({"text":"x","return_routed_experts":true})");
  ASSERT_TRUE(req);
  EXPECT_TRUE(req->return_routed_experts);
  EXPECT_FALSE(parse_api_request(api_kind::native, R"({"text":"x","return_routed_experts":1})"));
  EXPECT_FALSE(parse_api_request(api_kind::native, R"({"text":"x"})")->return_routed_experts);
  api_output out;
  out.tokens = {1, 2};
  out.text = "ab";
  out.finish_reason = "length";
  out.routed_experts = {0, 7, -1, 256};
  out.routed_spans = {{4, 0, 0}, {6, 1, 1}};
  auto body = json::parse(render_response(*req, out, "id", 0));
  // Little-endian int32: 0, 7, -1, 256.
  EXPECT_EQ(body["meta_info"]["routed_experts"], "AAAAAAcAAAD/////AAEAAA==");
  // An exact pin at 5 whose version advanced under it to 6: the rows say 5.
  auto stamped = json::parse(stamp_answer("/generate", body.dump(), {5, 5}, "r"));
  EXPECT_EQ(stamped["meta_info"]["routed_experts_version_spans"],
            json::parse(R"([{"version":5,"first_row":0,"last_row":1}])"));
}

} // namespace
} // namespace stitch::engine

namespace stitch::engine {

TEST(api_shapes, the_cache_namespace_composes_with_the_clients_own) {
  auto field = [](std::string_view body, const char* key = "extra_key") {
    return nlohmann::json::parse(namespace_cache("/generate", body, key, "r/weight_v000002"))[key];
  };
  EXPECT_EQ(field(R"({"text":"hi"})"), "r/weight_v000002");
  EXPECT_EQ(field(R"({"text":"hi","extra_key":null})"), "r/weight_v000002");
  EXPECT_EQ(field(R"({"text":"hi","extra_key":"tenant-a"})"), "r/weight_v000002:tenant-a");
  EXPECT_EQ(field(R"({"text":["a","b"],"extra_key":["x","y"]})"),
            nlohmann::json::parse(R"(["r/weight_v000002:x","r/weight_v000002:y"])"));
  // A value no engine takes is not a namespace: the version's replaces it.
  EXPECT_EQ(field(R"({"text":"hi","extra_key":7})"), "r/weight_v000002");
  EXPECT_EQ(field(R"({"text":"hi","extra_key":["x",1]})"), "r/weight_v000002");
  EXPECT_EQ(field(R"({"prompt":"hi","cache_salt":"s"})", "cache_salt"), "r/weight_v000002:s");
  // Two clients' keys under two versions never meet.
  EXPECT_NE(namespace_cache("/generate", R"({"extra_key":"2:x"})", "extra_key", "r/weight_v1"),
            namespace_cache("/generate", R"({"extra_key":"x"})", "extra_key", "r/weight_v12"));
  // Other routes and bodies that are not objects pass untouched.
  EXPECT_EQ(namespace_cache("/v1/models", R"({"extra_key":"x"})", "extra_key", "n"),
            R"({"extra_key":"x"})");
  EXPECT_EQ(namespace_cache("/generate", "[1]", "extra_key", "n"), "[1]");
}

} // namespace stitch::engine
