#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stitch::engine {

/// The byte-level tokenizer of the built-in engine: tokens 0..255 are the
/// bytes themselves, 256 is BOS and 257 is EOS (vocabulary of 258).
class tokenizer {
public:
  static constexpr int32_t bos = 256;
  static constexpr int32_t eos = 257;
  static constexpr uint32_t vocab_size = 258;

  /// BOS followed by one token per byte of `text`.
  std::vector<int32_t> encode(std::string_view text) const;

  /// The bytes of `tokens`; BOS, EOS and out-of-range ids are skipped.
  std::string decode(std::span<const int32_t> tokens) const;
};

} // namespace stitch::engine
