#include <gtest/gtest.h>

#include "runtime/node/cli.hpp"

namespace {

TEST(cli_test, overrides_must_be_key_value) {
  EXPECT_EQ(stitch::node::check_override("gateway.listen=127.0.0.1:8080"), "");
  EXPECT_NE(stitch::node::check_override("gateway.listen"), "");
  EXPECT_NE(stitch::node::check_override("=5"), "");
  EXPECT_NE(stitch::node::check_override("a b=5"), "");
}

} // namespace
