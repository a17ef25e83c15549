#include "runtime/core/engine_routes.hpp"

#include "runtime/core/error.hpp"

namespace stitch {

namespace {

bool plain_char(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.'
         || c == '_' || c == ':' || c == '-';
}

/// One or more segments of plain characters, none empty, `.` or `..`.
bool plain_segments(std::string_view rest) noexcept {
  if (rest.empty())
    return false;
  while (true) {
    auto slash = rest.find('/');
    auto seg = rest.substr(0, slash);
    if (seg.empty() || seg == "." || seg == "..")
      return false;
    for (char c : seg)
      if (!plain_char(c))
        return false;
    if (slash == std::string_view::npos)
      return true;
    rest.remove_prefix(slash + 1);
  }
}

bool path_matches(std::string_view pattern, std::string_view path) noexcept {
  auto hole = pattern.find("{}");
  if (hole == std::string_view::npos)
    return pattern == path;
  // `prefix{}suffix`: the hole takes what lies between.
  auto prefix = pattern.substr(0, hole);
  auto suffix = pattern.substr(hole + 2);
  if (path.size() < prefix.size() + suffix.size() || !path.starts_with(prefix)
      || !path.ends_with(suffix))
    return false;
  return plain_segments(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
}

} // namespace

bool route_listed(std::span<const engine_route> allowed, std::string_view method,
                  std::string_view path) noexcept {
  for (const auto& r : allowed)
    if (r.method == method && path_matches(r.path, path))
      return true;
  return false;
}

std::optional<std::string> route_refusal(std::span<const engine_route> allowed,
                                         std::string_view engine, std::string_view method,
                                         std::string_view path) {
  if (route_listed(allowed, method, path))
    return std::nullopt;
  std::string why = quote_untrusted(std::string{method} + " " + std::string{path}, 120)
                    + " is not passed to " + std::string{engine}
                    + ": Stitch passes its versioned routes (stamped) and the engine's read-only "
                      "and non-generating routes; the engine's control (weights, pauses, caches) "
                      "is Stitch's alone";
  for (const auto& r : allowed)
    if (path_matches(r.path, path)) {
      why += "; " + std::string{r.path} + " takes " + std::string{r.method};
      break;
    }
  return why;
}

} // namespace stitch
