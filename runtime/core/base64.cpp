#include "runtime/core/base64.hpp"

#include <array>
#include <cstdint>

namespace stitch {

namespace {

constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The 6-bit value of each character; -1 outside the alphabet.
constexpr std::array<int8_t, 256> reverse_alphabet() {
  std::array<int8_t, 256> table{};
  for (auto& v : table)
    v = -1;
  for (int i = 0; i < 64; ++i)
    table[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
  return table;
}

constexpr auto values = reverse_alphabet();

} // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t n = uint32_t{static_cast<unsigned char>(bytes[i])} << 16
                 | uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8
                 | uint32_t{static_cast<unsigned char>(bytes[i + 2])};
    out += alphabet[(n >> 18) & 63];
    out += alphabet[(n >> 12) & 63];
    out += alphabet[(n >> 6) & 63];
    out += alphabet[n & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = uint32_t{static_cast<unsigned char>(bytes[i])} << 16;
    if (rest == 2)
      n |= uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8;
    out += alphabet[(n >> 18) & 63];
    out += alphabet[(n >> 12) & 63];
    out += rest == 2 ? alphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0)
    return std::nullopt;
  size_t padding = 0;
  if (!text.empty() && text.back() == '=')
    padding = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    uint32_t n = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      int8_t v = values[static_cast<unsigned char>(c)];
      if (c == '=' && last && j >= 4 - padding)
        v = 0;
      else if (v < 0)
        return std::nullopt;
      n = n << 6 | static_cast<uint32_t>(v);
    }
    out += static_cast<char>((n >> 16) & 0xFF);
    if (!last || padding < 2)
      out += static_cast<char>((n >> 8) & 0xFF);
    if (!last || padding < 1)
      out += static_cast<char>(n & 0xFF);
  }
  return out;
}

} // namespace stitch
