#include <gtest/gtest.h>

#include "runtime/core/token.hpp"

namespace stitch {
namespace {

TEST(token, no_configured_token_admits_everyone) {
  EXPECT_TRUE(token_matches("", ""));
  EXPECT_TRUE(token_matches("", "anything"));
}

TEST(token, only_the_exact_token_matches) {
  EXPECT_TRUE(token_matches("s3cret", "s3cret"));
  EXPECT_FALSE(token_matches("s3cret", ""));
  EXPECT_FALSE(token_matches("s3cret", "s3cre"));
  EXPECT_FALSE(token_matches("s3cret", "s3cret!"));
  EXPECT_FALSE(token_matches("s3cret", "s3cre7"));
  EXPECT_FALSE(token_matches("s3cret", "S3CRET"));
  EXPECT_FALSE(token_matches("s3cret", std::string_view{"s3cret\0", 7}));
}

} // namespace
} // namespace stitch
