#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/constraint.hpp"
#include "runtime/core/error.hpp"

namespace stitch {

/// Every way an HTTP surface (replica, gateway, status, publisher) refuses or
/// fails a request (DESIGN §5). Status, error type, whether retrying helps
/// and `Retry-After` follow from the kind: decided here, once.
enum class http_failure : uint8_t {
  /// 400 `BadRequest`: malformed JSON, a bad constraint or field.
  bad_request,
  /// 401 `Unauthorized`: the admin token is missing or wrong.
  unauthorized,
  /// 403 `RouteBlocked`: an engine control route.
  route_blocked,
  /// 404 `NotFound`.
  not_found,
  /// 405 `MethodNotAllowed`.
  method_not_allowed,
  /// 413 `PayloadTooLarge`.
  payload_too_large,
  /// 415 `UnsupportedMediaType`: a body that is not JSON.
  unsupported_media_type,
  /// 409 `VersionExists`: a publish of a version stored with other content.
  version_exists,
  /// 409 `Rewind`: a publish below the run's newest version.
  rewind,
  /// 409 `Conflict`: the pointer moved concurrently (retryable).
  conflict,
  /// 431 `RequestHeaderFieldsTooLarge`.
  headers_too_large,
  /// 499 `ClientClosedRequest`: the client went away mid-request.
  client_closed,
  /// 500 `EngineError`: the engine failed this request (retryable elsewhere).
  engine_error,
  /// 500 `InternalError`.
  internal_error,
  /// 503 `EngineUnavailable`: not ready, rebuilding, retiring, no run
  /// claimed (retryable, `Retry-After: 1`).
  unavailable,
  /// 503 `DrainTimeout`: aborted for holding a weight update past
  /// `replica.drain_timeout` (retryable, `Retry-After: 1`).
  drain_timeout,
};

/// An error answer: what a surface sends for it.
struct http_error {
  uint16_t status = 500;
  std::string type;
  std::string message;
  bool retryable = false;
  /// Seconds for `Retry-After`; 0 = no header.
  uint32_t retry_after = 0;
  /// A 409 carries the rejection (its body is `rejection_json`).
  std::optional<rejection> not_ready;

  /// The JSON body (DESIGN §5): the error object at the top level and again
  /// under `"error"`.
  std::string body() const;

  friend bool operator==(const http_error&, const http_error&) = default;
};

/// The answer for `failure` with `message`.
http_error make_http_error(http_failure failure, std::string message);

/// 409 `WeightVersionNotReady` for `r` (`Retry-After: 1` when retryable).
http_error not_ready_error(rejection r);

/// A domain error as the answer a surface gives: `invalid_argument`,
/// `limit_exceeded` and malformed input → 400, `unauthorized` → 401,
/// `route_blocked` → 403, `not_found` → 404, `version_not_ready` → 409,
/// `version_exists` / `rewind` / `conflict` → 409 of that name,
/// `engine_unavailable` / `busy` / `no_run_claimed` / `activation_failed` →
/// 503 `EngineUnavailable` with `Retry-After: 1`,
/// `drain_timeout` → 503 `DrainTimeout`, anything else → 500 `EngineError`.
http_error http_error_of(const error& e);

/// The other way round, for a client of these surfaces: the domain error
/// code of an error answer, by its `type` (as `http_error_of` chose it), or
/// by its status when the type is not one of ours (503 →
/// `engine_unavailable`, another 4xx → `invalid_argument`, anything else →
/// `backend_failure`).
errc errc_of_http_answer(uint16_t status, std::string_view type);

} // namespace stitch
