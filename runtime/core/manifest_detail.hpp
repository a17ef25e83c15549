#pragma once

// Internal to the manifest's two files: manifest.cpp (names and the
// invariants of a parsed manifest) and manifest_json.cpp (the strict JSON
// reader and writer). Not for other includes.

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "runtime/core/manifest.hpp"

namespace stitch::manifest_detail {

inline constexpr size_t max_tensor_name_length = 1024;
inline constexpr size_t max_shard_name_length = 255;
inline constexpr std::string_view shard_suffix = ".safetensors";

error manifest_error(std::string message);
error limit_error(std::string message);
bool is_valid_utf8(std::string_view s);
error with_field(const std::string& field, const error& err, errc code = errc::invalid_manifest);
/// The number of tensors each list names, bounded.
status check_counts(const manifest& m);
/// Checks names and that every `weight_map` value is one of `shards`.
status check_weight_map(const std::map<std::string, std::string>& weight_map,
                        const std::set<std::string_view>& shards);

} // namespace stitch::manifest_detail
