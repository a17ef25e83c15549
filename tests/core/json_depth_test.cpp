#include "runtime/core/json_depth.hpp"

#include <gtest/gtest.h>

#include <string>

#include "runtime/core/constraint.hpp"

namespace stitch {
namespace {

std::string nested(size_t depth, std::string_view inner = "1") {
  return std::string(depth, '[') + std::string{inner} + std::string(depth, ']');
}

TEST(json_depth, nesting_is_counted_outside_strings_only) {
  EXPECT_TRUE(json_nesting_within(R"({"a":[1,{"b":[]}]})", 4));
  EXPECT_FALSE(json_nesting_within(R"({"a":[1,{"b":[]}]})", 3));
  EXPECT_TRUE(json_nesting_within(nested(64)));
  EXPECT_FALSE(json_nesting_within(nested(65)));
  // Brackets in strings, escaped quotes included, do not count.
  EXPECT_TRUE(json_nesting_within(R"({"text":"[[[[[[[[[[\"[[[[[[[["})", 1));
  EXPECT_TRUE(json_nesting_within("\"" + std::string(1000, '[') + "\"", 0));
  EXPECT_FALSE(json_nesting_within(R"({"a":"\\","b":)" + nested(2) + "}", 2))
    << "an escaped backslash does not escape the quote after it";
  EXPECT_TRUE(json_nesting_within(""));
}

TEST(json_depth, a_request_nesting_a_million_levels_is_refused_not_parsed) {
  // It once crashed the node: parsed fine, then overflowed the stack when
  // written back out.
  std::string body = R"({"text":"hi","x":)" + nested(1'000'000) + "}";
  auto c = constraint_from_body(body);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, errc::invalid_argument);
  EXPECT_NE(c.error().message.find("deeper than 64 levels"), std::string::npos)
    << c.error().message;
  auto s = strip_constraint(body);
  ASSERT_FALSE(s);
  EXPECT_TRUE(constraint_from_body(R"({"text":"hi","x":)" + nested(60) + "}"));
}

} // namespace
} // namespace stitch
