#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/error.hpp"

namespace stitch {

/// What a request requires of the serving version (DESIGN §5): a floor
/// and/or an exact pin; neither means "any".
struct constraint {
  std::optional<uint64_t> min_version;
  std::optional<uint64_t> exact_version;

  /// True when either bound is set.
  bool any() const noexcept { return min_version.has_value() || exact_version.has_value(); }

  /// True when `applied` is at least `min_version` and equals `exact_version`
  /// (each only when set).
  bool satisfied_by(uint64_t applied) const noexcept {
    return (!min_version || applied >= *min_version)
           && (!exact_version || applied == *exact_version);
  }

  friend bool operator==(const constraint&, const constraint&) = default;
};

/// The routes that generate and so take a constraint and get stamps:
/// `/generate`, `/v1/completions`, `/v1/chat/completions`.
bool is_versioned_route(std::string_view path) noexcept;

/// Header names of the constraint's alternative spelling.
inline constexpr std::string_view min_version_header = "X-Stitch-Min-Version";
inline constexpr std::string_view exact_version_header = "X-Stitch-Exact-Version";

/// Reads the `weight_version` object of a JSON request body. Absent or null
/// is no constraint. Values are non-negative integers or decimal-integer
/// strings fitting in int64 (`5`, `"5"`); `null` is absent. Every error is
/// `invalid_argument` naming the field (`weight_version.min_version`, ...).
result<constraint> constraint_from_body(std::string_view json_body);

/// A request body with its constraint taken out.
struct stripped_request {
  constraint c;
  /// The body without its top-level `weight_version` member, otherwise
  /// byte-for-byte the input (so the engine sees what the client sent).
  std::string body_without_constraint;
};

/// Like `constraint_from_body`, also removing `weight_version` (the engine
/// must not see it). A body without one comes back unchanged.
result<stripped_request> strip_constraint(std::string_view json_body);

/// Reads the `X-Stitch-Min-Version` / `X-Stitch-Exact-Version` header values
/// (decimal-integer strings, same rules as the body; a missing header is
/// nullopt).
result<constraint> constraint_from_headers(std::optional<std::string_view> min_header,
                                           std::optional<std::string_view> exact_header);

/// Combines the body's and the headers' constraints. A field given in both
/// must agree; the merged `exact_version` must not be below `min_version`.
result<constraint> merge(const constraint& body, const constraint& headers);

/// Why a request was refused with 409 `WeightVersionNotReady`.
struct rejection {
  /// The exact pin if set, else the floor.
  uint64_t target_version = 0;
  /// The replica's applied version; nullopt when it has none yet.
  std::optional<uint64_t> applied;
  /// False only when waiting cannot help: an exact pin below the applied
  /// version (a replica never goes back within a run).
  bool retryable = true;
  std::string message;

  friend bool operator==(const rejection&, const rejection&) = default;
};

/// Explains why `applied` does not satisfy `c`. Precondition: it does not.
rejection reject(const constraint& c, std::optional<uint64_t> applied);

/// The 409 body of DESIGN §5: `{"type":"WeightVersionNotReady",
/// "target_version":T,"applied":A,"message":"...","retryable":B}` with the
/// same object again under `"error"`; `applied` is null when none.
std::string rejection_json(const rejection& r);

/// Every other error response body, in the same shape as the 409:
/// `{"type":T,"message":M,"retryable":B,"error":{"type":T,"message":M,"retryable":B}}`.
std::string error_json(std::string_view type, std::string_view message, bool retryable);

} // namespace stitch
