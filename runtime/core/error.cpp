#include "runtime/core/error.hpp"

#include <system_error>

namespace stitch {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::none: return "none";
    case errc::invalid_argument: return "invalid_argument";
    case errc::invalid_manifest: return "invalid_manifest";
    case errc::invalid_format: return "invalid_format";
    case errc::version_not_ready: return "version_not_ready";
    case errc::rewind: return "rewind";
    case errc::version_exists: return "version_exists";
    case errc::conflict: return "conflict";
    case errc::not_found: return "not_found";
    case errc::missing_link: return "missing_link";
    case errc::checksum_mismatch: return "checksum_mismatch";
    case errc::drain_timeout: return "drain_timeout";
    case errc::engine_unavailable: return "engine_unavailable";
    case errc::no_run_claimed: return "no_run_claimed";
    case errc::route_blocked: return "route_blocked";
    case errc::backend_failure: return "backend_failure";
    case errc::corrupt_data: return "corrupt_data";
    case errc::activation_failed: return "activation_failed";
    case errc::decode_failure: return "decode_failure";
    case errc::limit_exceeded: return "limit_exceeded";
    case errc::unauthorized: return "unauthorized";
    case errc::busy: return "busy";
  }
  return "unknown";
}

std::string errno_text(int err) {
  return std::error_code{err, std::generic_category()}.message();
}

std::string quote_untrusted(std::string_view text, size_t limit) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out = "'";
  for (char c : text.substr(0, limit)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out.push_back(digits[u >> 4]);
      out.push_back(digits[u & 0xf]);
    } else {
      out.push_back(c);
    }
  }
  out += text.size() > limit ? "'..." : "'";
  return out;
}

std::string to_string(const error& err) {
  std::string out{to_string(err.code)};
  if (!err.message.empty()) {
    out += ": ";
    out += err.message;
  }
  return out;
}

} // namespace stitch
