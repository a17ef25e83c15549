#pragma once

#include <cstddef>
#include <string_view>

namespace stitch {

/// Deepest nesting of objects and arrays accepted in JSON from outside
/// (request bodies, engine answers, publish sessions). Real bodies nest a
/// few levels; a body of a million `[` would otherwise parse (nlohmann's
/// parser is iterative) and then overflow the stack when written back out
/// (its serializer recurses) — one request crashing the node.
inline constexpr size_t max_json_depth = 64;

/// Whether `text` nests objects and arrays at most `max_depth` deep
/// (brackets inside strings do not count). Linear, no allocation; says
/// nothing else about validity.
bool json_nesting_within(std::string_view text, size_t max_depth = max_json_depth) noexcept;

} // namespace stitch
