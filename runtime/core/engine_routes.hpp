#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace stitch {

/// A route a client may reach through Stitch (a pass-through): `method`
/// and `path`, where a `{}` segment stands for one or more path segments of
/// plain characters (`[A-Za-z0-9._:-]`, never `.` or `..`): a model name
/// such as `Qwen/Qwen3-8B`. `source` names the engine file and commit the
/// route follows.
struct engine_route {
  std::string_view method;
  std::string_view path;
  std::string_view source;
};

/// Whether `method path` is one of `allowed`. Matching is exact, on the
/// path as it arrived (a percent-encoded or dot-segment spelling of a
/// listed route is not that route).
bool route_listed(std::span<const engine_route> allowed, std::string_view method,
                  std::string_view path) noexcept;

/// Why `method path` is refused (403 RouteBlocked) when it is not one of
/// `allowed`; nothing when it is. `engine` names the engine (`sglang`).
std::optional<std::string> route_refusal(std::span<const engine_route> allowed,
                                         std::string_view engine, std::string_view method,
                                         std::string_view path);

} // namespace stitch
