#pragma once

#include <optional>
#include <string>
#include <string_view>

/// Base64 (RFC 4648 §4, the standard alphabet, padded).
namespace stitch {

/// `bytes` as padded base64.
std::string base64_encode(std::string_view bytes);

/// Strict base64 to bytes: padded, no whitespace, nothing after the
/// padding; nullopt when `text` is not that.
std::optional<std::string> base64_decode(std::string_view text);

} // namespace stitch
