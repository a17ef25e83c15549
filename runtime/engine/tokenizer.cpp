#include "runtime/engine/tokenizer.hpp"

namespace stitch::engine {

std::vector<int32_t> tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + 1);
  tokens.push_back(bos);
  for (char c : text) {
    tokens.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  }
  return tokens;
}

std::string tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(t)));
    }
  }
  return text;
}

} // namespace stitch::engine
