#pragma once

#include <string>
#include <variant>
#include <vector>

#include "runtime/core/constraint.hpp"
#include "transport/http_server.hpp"

namespace stitch::transport {

/// Which HTTP surface a request reached (DESIGN §5).
enum class surface : uint8_t { replica, gateway };

struct router_options {
  /// Session-affinity headers, first present wins.
  std::vector<std::string> affinity_headers = {"X-Session-Id", "Modal-Session-ID"};
  /// When set, `POST /wake` must carry `Authorization: Bearer <token>`.
  std::string admin_token;
};

/// Where a request goes. A pure function of the request decides it, so every
/// status code path is tested without sockets.
namespace routed {
/// A versioned route: admit under `c`, generate, stamp.
struct versioned {
  std::string pool;
  std::string route;
  constraint c;
  /// The body without its `weight_version` member.
  std::string body;
  std::string session;
};
/// Anything else: handed to the engine as is (its control routes are 403
/// at the replica, which knows them).
struct passthrough {
  std::string pool;
  std::string method;
  std::string route;
  std::string body;
  std::string session;
};
struct health {
  std::string pool;
};
struct server_info {};
struct wake {
  std::string pool;
};
struct pool_view {
  std::string pool;
};
/// Answered by the router itself (4xx).
struct refuse {
  server_response response;
};
} // namespace routed

using route_decision =
  std::variant<routed::versioned, routed::passthrough, routed::health, routed::server_info,
               routed::wake, routed::pool_view, routed::refuse>;

/// Classifies `req`: the pool (`/pools/<name>/...` prefix, else the
/// `X-Stitch-Pool` header, else `default`), Stitch's own routes, the
/// constraint of a versioned route (body and headers merged, DESIGN §5
/// acceptance rules) and every 4xx: 400 malformed JSON or constraint, 401
/// missing admin token, 405 wrong method, 415 a body that is not JSON.
route_decision route_request(surface where, const server_request& req,
                             const router_options& options);

/// True when `name` is a valid pool name (`[A-Za-z0-9._-]{1,64}`, not `.` or `..`).
bool valid_pool_name(std::string_view name) noexcept;

} // namespace stitch::transport
