#include <gtest/gtest.h>

#include "runtime/core/version_ref.hpp"

namespace stitch {
namespace {

TEST(version_ref, prints_six_digit_identity) {
  EXPECT_EQ(to_string(version_ref{"run-1", 7}), "run-1/weight_v000007");
  EXPECT_EQ(to_string(version_ref{"", 7}), "weight_v000007");
  EXPECT_EQ(to_string(version_ref{"r", 12345678}), "r/weight_v12345678");
}

TEST(version_ref, parses_identity_bare_and_short_forms) {
  auto full = parse_version_ref("run-1/weight_v000007");
  ASSERT_TRUE(full && full->has_value());
  EXPECT_EQ(**full, (version_ref{"run-1", 7}));
  auto bare = parse_version_ref("weight_v000042");
  ASSERT_TRUE(bare && bare->has_value());
  EXPECT_EQ(**bare, (version_ref{"", 42}));
  auto short_form = parse_version_ref("exp.2/9");
  ASSERT_TRUE(short_form && short_form->has_value());
  EXPECT_EQ(**short_form, (version_ref{"exp.2", 9}));
}

TEST(version_ref, round_trips_through_text) {
  for (uint64_t v : {0ull, 1ull, 999999ull, 1000000ull, 18446744073709551615ull}) {
    version_ref ref{"a_b-c.d", v};
    auto back = parse_required_version_ref(to_string(ref));
    ASSERT_TRUE(back) << to_string(back.error());
    EXPECT_EQ(*back, ref);
  }
}

TEST(version_ref, empty_string_is_no_version) {
  auto none = parse_version_ref("");
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  auto blank = parse_version_ref("  \n");
  ASSERT_TRUE(blank);
  EXPECT_FALSE(blank->has_value());
  EXPECT_FALSE(parse_required_version_ref(""));
}

TEST(version_ref, garbage_is_an_error_quoting_the_text) {
  for (const char* text :
       {"latest", "weight_v", "weight_vx1", "run/weight_v-1", "run/", "/weight_v000001",
        "run/weight_v1/extra", "7", "run/7x", "run/weight_v99999999999999999999999"}) {
    auto parsed = parse_version_ref(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_EQ(parsed.error().code, errc::invalid_argument);
    EXPECT_NE(parsed.error().message.find(text), std::string::npos) << parsed.error().message;
  }
}

TEST(version_ref, control_bytes_are_escaped_in_errors) {
  auto parsed = parse_version_ref(std::string_view{"r\0x/1", 5});
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.error().message.find("\\x00"), std::string::npos) << parsed.error().message;
}

TEST(version_ref, run_ids_are_validated) {
  EXPECT_TRUE(validate_run_id("Run_1.2-x"));
  EXPECT_FALSE(validate_run_id(""));
  EXPECT_FALSE(validate_run_id(".."));
  EXPECT_FALSE(validate_run_id("a/b"));
  EXPECT_FALSE(validate_run_id("a b"));
  EXPECT_FALSE(validate_run_id(std::string(65, 'a')));
  EXPECT_TRUE(validate_run_id(std::string(64, 'a')));
  auto bad = parse_version_ref("bad run/weight_v000001");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("[A-Za-z0-9._-]"), std::string::npos);
}

} // namespace
} // namespace stitch
