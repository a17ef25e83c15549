#pragma once

#include <string_view>

namespace stitch {

/// Whether `presented` is the admin token `configured` (DESIGN §5): an empty
/// configured token admits everyone. Constant time in the configured token's
/// length, so timing does not reveal how much of a guess was right.
bool token_matches(std::string_view configured, std::string_view presented) noexcept;

} // namespace stitch
