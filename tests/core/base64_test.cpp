#include <gtest/gtest.h>

#include "runtime/core/base64.hpp"

namespace stitch {
namespace {

TEST(base64, encodes_the_rfc_4648_test_vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
}

TEST(base64, decoding_inverts_encoding_for_every_byte) {
  std::string all;
  for (int i = 0; i < 256; ++i)
    all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    auto back = base64_decode(base64_encode(all.substr(0, n)));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, all.substr(0, n));
  }
  auto back = base64_decode(base64_encode(all));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, all);
}

TEST(base64, anything_but_strict_padded_base64_is_refused) {
  for (const char* bad :
       {"Zg", "Zg=", "Zm9", "Z===", "Zg==Zg==", "Zm 9v", "Zm9v\n", "Zm-v", "=Zm9", "Zg=a"})
    EXPECT_FALSE(base64_decode(bad)) << bad;
}

} // namespace
} // namespace stitch
