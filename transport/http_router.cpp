#include "transport/http_router.hpp"

#include "runtime/core/token.hpp"

#include <algorithm>

namespace stitch::transport {

namespace {

routed::refuse refuse(http_failure why, std::string message) {
  return {error_response(why, std::move(message))};
}

routed::refuse wrong_method(std::string_view path, std::string_view allowed) {
  auto r = error_response(http_failure::method_not_allowed,
                          std::string{path} + " takes " + std::string{allowed});
  r.headers.push_back({"Allow", std::string{allowed}});
  return {std::move(r)};
}

bool json_content_type(const std::string* type) {
  if (!type)
    return true; // clients that send none still send JSON bodies
  std::string_view t{*type};
  t = t.substr(0, t.find(';'));
  while (!t.empty() && t.back() == ' ')
    t.remove_suffix(1);
  std::string lower{t};
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower == "application/json" || (lower.size() > 5 && lower.ends_with("+json"));
}

} // namespace

bool valid_pool_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64 || name == "." || name == "..")
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.'
           || c == '_' || c == '-';
  });
}

route_decision route_request(surface where, const server_request& req,
                             const router_options& options) {
  std::string path = req.path.empty() ? "/" : req.path;
  std::string pool = "default";
  bool pool_from_path = false;
  if (where == surface::gateway && path.starts_with("/pools/")) {
    auto rest = std::string_view{path}.substr(7);
    auto slash = rest.find('/');
    auto name = rest.substr(0, slash);
    if (!valid_pool_name(name))
      return refuse(http_failure::bad_request,
                    "pool name " + quote_untrusted(name) + " is not [A-Za-z0-9._-]{1,64}");
    pool = std::string{name};
    path = slash == std::string_view::npos ? "/" : std::string{rest.substr(slash)};
    pool_from_path = true;
  }
  if (where == surface::gateway && !pool_from_path) {
    if (const auto* header = req.header("X-Stitch-Pool")) {
      if (!valid_pool_name(*header))
        return refuse(http_failure::bad_request,
                      "X-Stitch-Pool " + quote_untrusted(*header) + " is not [A-Za-z0-9._-]{1,64}");
      pool = *header;
    }
  }
  std::string session;
  for (const auto& name : options.affinity_headers)
    if (const auto* v = req.header(name); v && !v->empty()) {
      session = *v;
      break;
    }

  if (path == "/health") {
    if (req.method != "GET" && req.method != "HEAD")
      return wrong_method(path, "GET");
    return routed::health{pool};
  }
  if (path == "/wake") {
    if (req.method != "POST")
      return wrong_method(path, "POST");
    if (!options.admin_token.empty()) {
      const auto* auth = req.header("Authorization");
      std::string_view given = auth ? std::string_view{*auth} : std::string_view{};
      if (!given.starts_with("Bearer ") || !token_matches(options.admin_token, given.substr(7)))
        return refuse(http_failure::unauthorized,
                      "POST /wake needs Authorization: Bearer <admin token>");
    }
    return routed::wake{pool};
  }
  if (where == surface::replica && path == "/server_info") {
    if (req.method != "GET")
      return wrong_method(path, "GET");
    return routed::server_info{};
  }
  if (where == surface::gateway && path == "/pool") {
    if (req.method != "GET")
      return wrong_method(path, "GET");
    return routed::pool_view{pool};
  }
  if (is_versioned_route(path)) {
    if (req.method != "POST")
      return wrong_method(path, "POST");
    if (!json_content_type(req.header("Content-Type")))
      return refuse(http_failure::unsupported_media_type,
                    "Content-Type must be application/json, not "
                      + quote_untrusted(*req.header("Content-Type")));
    auto stripped = strip_constraint(req.body);
    if (!stripped)
      return refuse(http_failure::bad_request, stripped.error().message);
    const auto* min = req.header(min_version_header);
    const auto* exact = req.header(exact_version_header);
    auto from_headers =
      constraint_from_headers(min ? std::optional<std::string_view>{*min} : std::nullopt,
                              exact ? std::optional<std::string_view>{*exact} : std::nullopt);
    if (!from_headers)
      return refuse(http_failure::bad_request, from_headers.error().message);
    auto merged = merge(stripped->c, *from_headers);
    if (!merged)
      return refuse(http_failure::bad_request, merged.error().message);
    return routed::versioned{pool, path, *merged, std::move(stripped->body_without_constraint),
                             session};
  }
  return routed::passthrough{pool, req.method, path, req.body, session};
}

} // namespace stitch::transport
