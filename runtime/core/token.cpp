#include "runtime/core/token.hpp"

namespace stitch {

bool token_matches(std::string_view configured, std::string_view presented) noexcept {
  if (configured.empty())
    return true;
  unsigned char diff = presented.size() == configured.size() ? 0 : 1;
  for (size_t i = 0; i < configured.size(); ++i)
    diff |= static_cast<unsigned char>(configured[i] ^ (i < presented.size() ? presented[i] : 0));
  return diff == 0;
}

} // namespace stitch
