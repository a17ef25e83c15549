#include "runtime/core/constraint.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

using namespace stitch;
using nlohmann::json;
using testing::HasSubstr;

namespace {

constraint body_constraint(std::string_view body) {
  auto c = constraint_from_body(body);
  EXPECT_TRUE(c) << body << ": " << c.error().message;
  return c ? *c : constraint{};
}

/// Expects `body` to be refused with a 400-class error mentioning each of `parts`.
void expect_body_refused(std::string_view body, std::initializer_list<std::string> parts) {
  auto c = constraint_from_body(body);
  ASSERT_FALSE(c) << "accepted: " << body;
  EXPECT_EQ(c.error().code, errc::invalid_argument);
  for (const auto& part : parts)
    EXPECT_THAT(c.error().message, HasSubstr(part)) << body;
  auto s = strip_constraint(body);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error(), c.error());
}

constraint make(std::optional<uint64_t> min, std::optional<uint64_t> exact) {
  return constraint{min, exact};
}

} // namespace

TEST(constraint, any_and_satisfied_by) {
  EXPECT_FALSE(constraint{}.any());
  EXPECT_TRUE(constraint{}.satisfied_by(0));
  auto floor = make(5, std::nullopt);
  EXPECT_TRUE(floor.any());
  EXPECT_FALSE(floor.satisfied_by(4));
  EXPECT_TRUE(floor.satisfied_by(5));
  EXPECT_TRUE(floor.satisfied_by(9));
  auto pin = make(std::nullopt, 7);
  EXPECT_FALSE(pin.satisfied_by(6));
  EXPECT_TRUE(pin.satisfied_by(7));
  EXPECT_FALSE(pin.satisfied_by(8));
  auto both = make(5, 7);
  EXPECT_TRUE(both.satisfied_by(7));
  EXPECT_FALSE(both.satisfied_by(5));
}

TEST(constraint, reference_client_shape) {
  EXPECT_EQ(body_constraint(
              R"({"prompt": "hi", "weight_version": {"min_version": 5, "exact_version": null}})"),
            make(5, std::nullopt));
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": null, "exact_version": 8}})"),
            make(std::nullopt, 8));
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": null, "exact_version": null}})"),
            constraint{});
}

TEST(constraint, string_forms) {
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": "5", "exact_version": "7"}})"),
            make(5, 7));
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": "0"}})"), make(0, std::nullopt));
  EXPECT_EQ(body_constraint(R"({"weight_version": {"exact_version": "9223372036854775807"}})"),
            make(std::nullopt, 9223372036854775807u));
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": "\u0035"}})"),
            make(5, std::nullopt));
}

TEST(constraint, absent_or_null_is_no_constraint) {
  EXPECT_EQ(body_constraint(R"({"prompt": "x"})"), constraint{});
  EXPECT_EQ(body_constraint(R"({"weight_version": null})"), constraint{});
  EXPECT_EQ(body_constraint(R"({"weight_version": {}})"), constraint{});
  EXPECT_EQ(body_constraint("{}"), constraint{});
  // Only the top level counts: a nested weight_version is the engine's business.
  EXPECT_EQ(body_constraint(R"({"extra": {"weight_version": {"min_version": 3}}})"), constraint{});
}

TEST(constraint, body_must_be_json_object) {
  for (std::string_view body :
       {"", "[]", "5", "\"x\"", "null", "{", "{\"a\":1} trailing", "{'a':1}"})
    expect_body_refused(body, {"request body must be a JSON object"});
}

TEST(constraint, weight_version_must_be_object) {
  for (std::string_view body : {R"({"weight_version": 5})", R"({"weight_version": "5"})",
                                R"({"weight_version": [5]})", R"({"weight_version": true})"})
    expect_body_refused(body, {"weight_version must be a JSON object"});
}

TEST(constraint, unknown_key_is_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": 1, "max_version": 3}})",
                      {"weight_version", "'max_version'"});
  expect_body_refused(R"({"weight_version": {"MIN_VERSION": 1}})", {"'MIN_VERSION'"});
}

TEST(constraint, booleans_are_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": true}})",
                      {"weight_version.min_version", "true"});
  expect_body_refused(R"({"weight_version": {"exact_version": false}})",
                      {"weight_version.exact_version", "false"});
}

TEST(constraint, floats_are_refused) {
  for (std::string_view v : {"5.0", "5.5", "5e0", "1E3", "-0.0"})
    expect_body_refused(R"({"weight_version": {"min_version": )" + std::string(v) + "}}",
                        {"weight_version.min_version", "integer", std::string(v)});
}

TEST(constraint, negative_numbers_are_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": -1}})",
                      {"weight_version.min_version", "non-negative", "-1"});
  expect_body_refused(R"({"weight_version": {"exact_version": -0}})",
                      {"weight_version.exact_version"});
}

TEST(constraint, bad_strings_are_refused) {
  for (std::string_view v : {"abc", "", "-1", " 5", "5 ", "+5", "5x", "0x10", "5.0", "1e3"}) {
    auto body = R"({"weight_version": {"exact_version": )" + json(v).dump() + "}}";
    expect_body_refused(body, {"weight_version.exact_version"});
  }
}

TEST(constraint, values_must_fit_int64) {
  expect_body_refused(R"({"weight_version": {"min_version": 9223372036854775808}})",
                      {"weight_version.min_version", "larger"});
  expect_body_refused(R"({"weight_version": {"min_version": "9223372036854775808"}})",
                      {"weight_version.min_version", "larger"});
  expect_body_refused(R"({"weight_version": {"min_version": 100000000000000000000000}})",
                      {"weight_version.min_version"});
}

TEST(constraint, arrays_and_objects_are_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": [5]}})",
                      {"weight_version.min_version", "an array"});
  expect_body_refused(R"({"weight_version": {"exact_version": {"v": 5}}})",
                      {"weight_version.exact_version", "an object"});
}

TEST(constraint, exact_below_min_is_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": 5, "exact_version": 3}})",
                      {"weight_version.exact_version 3", "weight_version.min_version 5"});
  EXPECT_EQ(body_constraint(R"({"weight_version": {"min_version": 5, "exact_version": 5}})"),
            make(5, 5));
}

TEST(constraint, duplicate_keys_are_refused) {
  expect_body_refused(R"({"weight_version": {"min_version": 5, "min_version": 6}})",
                      {"weight_version.min_version", "twice"});
  expect_body_refused(R"({"weight_version": {"min_version": 5}, "weight_version": null})",
                      {"weight_version", "twice"});
}

TEST(constraint, strip_removes_weight_version) {
  struct example {
    std::string body;
    std::string stripped;
  };
  const example examples[] = {
    {R"({"prompt": "hi", "weight_version": {"min_version": 5, "exact_version": null}})",
     R"({"prompt": "hi"})"},
    {R"({"weight_version": {"min_version": 5}, "prompt": "hi"})", R"({"prompt": "hi"})"},
    {R"({"weight_version": {"min_version": 5}})", R"({})"},
    {R"({ "a": 1 , "weight_version" : null , "b": [1, {"c": "}"}] })",
     R"({ "a": 1 , "b": [1, {"c": "}"}] })"},
    {"{\n  \"weight_version\": {\"exact_version\": \"3\"},\n  \"x\": \"\\\"\"\n}",
     "{\n  \"x\": \"\\\"\"\n}"},
    {R"({"weight\u005fversion": {"min_version": 2}, "z": 0})", R"({"z": 0})"},
  };
  for (const auto& e : examples) {
    auto s = strip_constraint(e.body);
    ASSERT_TRUE(s) << e.body << ": " << s.error().message;
    EXPECT_EQ(s->body_without_constraint, e.stripped) << e.body;
    EXPECT_FALSE(json::parse(s->body_without_constraint).contains("weight_version"));
    EXPECT_EQ(s->c, *constraint_from_body(e.body));
  }
}

TEST(constraint, strip_leaves_body_without_constraint_untouched) {
  const std::string bodies[] = {R"({"prompt":"x","max_tokens":  16,"x":1.50})",
                                "\xEF\xBB\xBF{\"a\": 1}", " {\"text\": \"\\u00e9\"} \n",
                                R"({"nested": {"weight_version": {"min_version": 1}}})"};
  for (const auto& body : bodies) {
    auto s = strip_constraint(body);
    ASSERT_TRUE(s) << body << ": " << s.error().message;
    EXPECT_EQ(s->body_without_constraint, body);
    EXPECT_FALSE(s->c.any());
  }
}

TEST(constraint, strip_after_byte_order_mark) {
  auto s = strip_constraint("\xEF\xBB\xBF{\"weight_version\": {\"min_version\": 1}, \"a\": 2}");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->body_without_constraint, "\xEF\xBB\xBF{\"a\": 2}");
  EXPECT_EQ(s->c, make(1, std::nullopt));
}

TEST(constraint, header_only) {
  auto c = constraint_from_headers("5", std::nullopt);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, make(5, std::nullopt));
  c = constraint_from_headers(std::nullopt, "7");
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, make(std::nullopt, 7));
  c = constraint_from_headers(std::nullopt, std::nullopt);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->any());
  auto merged = merge(constraint{}, make(5, 9));
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, make(5, 9));
}

TEST(constraint, bad_headers_are_refused) {
  for (std::string_view v : {"", "abc", "-1", " 5", "5 ", "+5", "5.0", "9223372036854775808"}) {
    auto c = constraint_from_headers(v, std::nullopt);
    ASSERT_FALSE(c) << v;
    EXPECT_EQ(c.error().code, errc::invalid_argument);
    EXPECT_THAT(c.error().message, HasSubstr("X-Stitch-Min-Version"));
    c = constraint_from_headers(std::nullopt, v);
    ASSERT_FALSE(c) << v;
    EXPECT_THAT(c.error().message, HasSubstr("X-Stitch-Exact-Version"));
  }
  auto c = constraint_from_headers("5", "3");
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message, HasSubstr("X-Stitch-Exact-Version 3"));
  EXPECT_THAT(c.error().message, HasSubstr("X-Stitch-Min-Version 5"));
}

TEST(constraint, body_and_header_agree) {
  auto merged = merge(make(5, std::nullopt), make(5, std::nullopt));
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, make(5, std::nullopt));
  merged = merge(make(5, std::nullopt), make(std::nullopt, 8));
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, make(5, 8));
}

TEST(constraint, body_and_header_disagree) {
  auto merged = merge(make(5, std::nullopt), make(6, std::nullopt));
  ASSERT_FALSE(merged);
  EXPECT_EQ(merged.error().code, errc::invalid_argument);
  EXPECT_EQ(merged.error().message,
            "min_version: body says 5 but header X-Stitch-Min-Version says 6");
  merged = merge(make(std::nullopt, 7), make(std::nullopt, 8));
  ASSERT_FALSE(merged);
  EXPECT_THAT(merged.error().message, HasSubstr("exact_version"));
  EXPECT_THAT(merged.error().message, HasSubstr("X-Stitch-Exact-Version"));
}

TEST(constraint, merged_exact_below_min_is_refused) {
  auto merged = merge(make(5, std::nullopt), make(std::nullopt, 3));
  ASSERT_FALSE(merged);
  EXPECT_THAT(merged.error().message, HasSubstr("X-Stitch-Exact-Version"));
  EXPECT_THAT(merged.error().message, HasSubstr("weight_version.min_version 5"));
}

TEST(constraint, reject_targets_exact_else_min) {
  auto r = reject(make(5, std::nullopt), 3);
  EXPECT_EQ(r.target_version, 5u);
  EXPECT_EQ(r.applied, 3u);
  EXPECT_TRUE(r.retryable);
  EXPECT_THAT(r.message, HasSubstr("min_version 5"));
  r = reject(make(2, 7), 3);
  EXPECT_EQ(r.target_version, 7u);
  EXPECT_TRUE(r.retryable);
  r = reject(make(std::nullopt, 7), std::nullopt);
  EXPECT_EQ(r.applied, std::nullopt);
  EXPECT_TRUE(r.retryable);
}

TEST(constraint, exact_pin_behind_applied_is_not_retryable) {
  auto r = reject(make(std::nullopt, 4), 9);
  EXPECT_EQ(r.target_version, 4u);
  EXPECT_FALSE(r.retryable);
  EXPECT_THAT(r.message, HasSubstr("never goes back"));
  EXPECT_TRUE(reject(make(std::nullopt, 10), 9).retryable);
}

TEST(constraint, error_json_has_the_same_shape_as_the_409) {
  auto j = json::parse(error_json("EngineUnavailable", "no run \"claimed\"", true));
  EXPECT_EQ(j["type"], "EngineUnavailable");
  EXPECT_EQ(j["message"], "no run \"claimed\"");
  EXPECT_EQ(j["retryable"], true);
  auto inner = j["error"];
  j.erase("error");
  EXPECT_EQ(inner, j);
  // Bytes that are not UTF-8 are replaced, never an exception.
  EXPECT_NO_THROW(json::parse(error_json("BadRequest", "\xff\xfe", false)));
}

TEST(constraint, rejection_json_shape) {
  auto text = rejection_json(reject(make(5, std::nullopt), 3));
  auto j = json::parse(text);
  EXPECT_EQ(j["type"], "WeightVersionNotReady");
  EXPECT_EQ(j["target_version"], 5);
  EXPECT_EQ(j["applied"], 3);
  EXPECT_EQ(j["retryable"], true);
  EXPECT_TRUE(j["message"].is_string());
  auto inner = j["error"];
  j.erase("error");
  EXPECT_EQ(inner, j);
  EXPECT_EQ(
    text.rfind(R"({"type":"WeightVersionNotReady","target_version":5,"applied":3,"message":)", 0),
    0u)
    << text;

  auto none = json::parse(rejection_json(reject(make(std::nullopt, 2), std::nullopt)));
  EXPECT_TRUE(none["applied"].is_null());
  EXPECT_TRUE(none["error"]["applied"].is_null());
  auto old = json::parse(rejection_json(reject(make(std::nullopt, 2), 5)));
  EXPECT_EQ(old["retryable"], false);
  EXPECT_EQ(old["error"]["retryable"], false);
}
