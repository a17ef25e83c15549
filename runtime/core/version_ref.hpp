#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/error.hpp"

namespace stitch {

/// A published policy version: `(run_id, version)`, printed as
/// `<run_id>/weight_v000007`. An empty `run_id` means "bare" (no run named).
struct version_ref {
  std::string run_id;
  uint64_t version = 0;

  friend auto operator<=>(const version_ref&, const version_ref&) = default;
  friend bool operator==(const version_ref&, const version_ref&) = default;
};

/// Longest accepted run id.
inline constexpr size_t max_run_id_length = 64;

/// Checks a run id against `[A-Za-z0-9._-]{1,64}`; "." and ".." are refused
/// because run ids become path and object-key components.
status validate_run_id(std::string_view run_id);

/// Checks a pool name (the same alphabet as run ids).
status validate_pool(std::string_view pool);

/// The directory name of a version: `weight_v000007` (at least six digits).
std::string version_dir_name(uint64_t version);

/// `run/weight_v000007`, or `weight_v000007` for a bare ref.
std::string to_string(const version_ref& ref);

/// Parses `run/weight_v000007`, bare `weight_v000007`, and the CLI's short
/// form `run/7`. An empty (or all-blank) string is "no version" (nullopt); any
/// other string that is not of those forms is an error quoting it.
result<std::optional<version_ref>> parse_version_ref(std::string_view text);

/// Like `parse_version_ref`, but "no version" is an error too.
result<version_ref> parse_required_version_ref(std::string_view text);

} // namespace stitch
