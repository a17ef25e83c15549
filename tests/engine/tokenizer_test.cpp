#include <gtest/gtest.h>

#include "runtime/engine/tokenizer.hpp"

namespace stitch::engine {
namespace {

TEST(tokenizer, encode_is_bos_then_bytes) {
  tokenizer tok;
  auto tokens = tok.encode("hi\xff");
  EXPECT_EQ(tokens, (std::vector<int32_t>{tokenizer::bos, 'h', 'i', 255}));
  EXPECT_EQ(tok.encode(""), (std::vector<int32_t>{tokenizer::bos}));
}

TEST(tokenizer, round_trips_every_byte) {
  tokenizer tok;
  std::string text;
  for (int b = 0; b < 256; ++b) {
    text.push_back(static_cast<char>(b));
  }
  text += "héllo wörld\n";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(tokenizer, decode_skips_special_and_out_of_range_tokens) {
  tokenizer tok;
  std::vector<int32_t> tokens{tokenizer::bos, 'a', tokenizer::eos, 'b', -1, 9999};
  EXPECT_EQ(tok.decode(tokens), "ab");
}

} // namespace
} // namespace stitch::engine
