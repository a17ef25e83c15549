#include "transport/capability.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace stitch::transport {

std::string member_capability(std::string_view admin_token) {
  if (admin_token.empty())
    return {};
  static constexpr std::string_view label = "stitch member capability v1";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), admin_token.data(), static_cast<int>(admin_token.size()),
       reinterpret_cast<const unsigned char*>(label.data()), label.size(), mac, &size);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out = "member-";
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(digits[mac[i] >> 4]);
    out.push_back(digits[mac[i] & 0xf]);
  }
  return out;
}

} // namespace stitch::transport
