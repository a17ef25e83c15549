#pragma once

// Constraints as the core tests write them.

#include "runtime/core/constraint.hpp"

namespace stitch::testing {

/// No constraint.
inline constraint any() {
  return {};
}
/// `min_version = v`.
inline constraint min_v(uint64_t v) {
  return {v, std::nullopt};
}
/// `exact_version = v`.
inline constraint exact_v(uint64_t v) {
  return {std::nullopt, v};
}

} // namespace stitch::testing
