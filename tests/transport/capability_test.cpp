// The member capability: HMAC-SHA256 of a fixed label keyed by the admin
// token (checked against Python's hmac module), one-way, empty for no token.

#include <gtest/gtest.h>

#include "transport/capability.hpp"

namespace stitch::transport {
namespace {

TEST(member_capability, is_the_hmac_of_its_label_keyed_by_the_admin_token) {
  // python3 -c "import hmac,hashlib; print(hmac.new(b's3cret',
  //   b'stitch member capability v1', hashlib.sha256).hexdigest())"
  EXPECT_EQ(member_capability("s3cret"),
            "member-c3a77ec321793828171008a151da013e357f881a3e906ff214da42d500aefc32");
  EXPECT_NE(member_capability("s3cret"), member_capability("s3cret "));
  EXPECT_EQ(member_capability(""), "") << "no token, no capability: an open cluster";
}

} // namespace
} // namespace stitch::transport
