#include "runtime/core/http_errors.hpp"

#include <utility>

namespace stitch {

namespace {

struct shape {
  uint16_t status;
  std::string_view type;
  bool retryable;
  uint32_t retry_after;
};

shape shape_of(http_failure f) {
  switch (f) {
    case http_failure::bad_request: return {400, "BadRequest", false, 0};
    case http_failure::unauthorized: return {401, "Unauthorized", false, 0};
    case http_failure::route_blocked: return {403, "RouteBlocked", false, 0};
    case http_failure::not_found: return {404, "NotFound", false, 0};
    case http_failure::method_not_allowed: return {405, "MethodNotAllowed", false, 0};
    case http_failure::payload_too_large: return {413, "PayloadTooLarge", false, 0};
    case http_failure::unsupported_media_type: return {415, "UnsupportedMediaType", false, 0};
    case http_failure::version_exists: return {409, "VersionExists", false, 0};
    case http_failure::rewind: return {409, "Rewind", false, 0};
    case http_failure::conflict: return {409, "Conflict", true, 1};
    case http_failure::headers_too_large: return {431, "RequestHeaderFieldsTooLarge", false, 0};
    case http_failure::client_closed: return {499, "ClientClosedRequest", false, 0};
    case http_failure::engine_error: return {500, "EngineError", true, 0};
    case http_failure::internal_error: return {500, "InternalError", true, 0};
    case http_failure::unavailable: return {503, "EngineUnavailable", true, 1};
    case http_failure::drain_timeout: return {503, "DrainTimeout", true, 1};
  }
  return {500, "InternalError", true, 0};
}

} // namespace

std::string http_error::body() const {
  if (not_ready)
    return rejection_json(*not_ready);
  return error_json(type, message, retryable);
}

http_error make_http_error(http_failure failure, std::string message) {
  auto s = shape_of(failure);
  return {s.status, std::string{s.type}, std::move(message), s.retryable, s.retry_after, {}};
}

http_error not_ready_error(rejection r) {
  http_error e;
  e.status = 409;
  e.type = "WeightVersionNotReady";
  e.message = r.message;
  e.retryable = r.retryable;
  e.retry_after = r.retryable ? 1 : 0;
  e.not_ready = std::move(r);
  return e;
}

http_error http_error_of(const error& e) {
  switch (e.code) {
    case errc::invalid_argument:
    case errc::invalid_manifest:
    case errc::invalid_format:
    case errc::limit_exceeded: return make_http_error(http_failure::bad_request, e.message);
    case errc::unauthorized: return make_http_error(http_failure::unauthorized, e.message);
    case errc::route_blocked: return make_http_error(http_failure::route_blocked, e.message);
    case errc::not_found: return make_http_error(http_failure::not_found, e.message);
    case errc::version_not_ready:
      return not_ready_error(rejection{0, std::nullopt, true, e.message});
    case errc::engine_unavailable:
    case errc::busy:
    case errc::no_run_claimed:
    case errc::activation_failed: return make_http_error(http_failure::unavailable, e.message);
    case errc::drain_timeout: return make_http_error(http_failure::drain_timeout, e.message);
    case errc::version_exists: return make_http_error(http_failure::version_exists, e.message);
    case errc::rewind: return make_http_error(http_failure::rewind, e.message);
    case errc::conflict: return make_http_error(http_failure::conflict, e.message);
    default: return make_http_error(http_failure::engine_error, to_string(e));
  }
}

errc errc_of_http_answer(uint16_t status, std::string_view type) {
  static constexpr std::pair<std::string_view, errc> by_type[] = {
    {"BadRequest", errc::invalid_argument},
    {"PayloadTooLarge", errc::limit_exceeded},
    {"Unauthorized", errc::unauthorized},
    {"RouteBlocked", errc::route_blocked},
    {"NotFound", errc::not_found},
    {"WeightVersionNotReady", errc::version_not_ready},
    {"EngineUnavailable", errc::engine_unavailable},
    {"DrainTimeout", errc::drain_timeout},
    {"VersionExists", errc::version_exists},
    {"Rewind", errc::rewind},
    {"Conflict", errc::conflict},
  };
  for (const auto& [name, code] : by_type)
    if (type == name)
      return code;
  if (status == 503)
    return errc::engine_unavailable;
  if (status >= 400 && status < 500)
    return errc::invalid_argument;
  return errc::backend_failure;
}

} // namespace stitch
