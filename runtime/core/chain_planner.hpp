#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

/// What a replica currently serves, as the planner sees it.
struct applied_state {
  version_ref ref;
  /// False when the serving weights cannot be built upon (a failed or
  /// unverified state): the plan then seeds from an anchor.
  bool usable = true;
};

/// How to bring a replica from its applied state to the pointer.
struct chain_plan {
  /// The version the plan ends at (the pointer).
  version_ref target;
  /// The pointer names another run than the applied one: drain everything,
  /// flush caches, start over from that run's chain.
  bool reset_to_boot = false;
  /// The full anchor to seed the shadow from; nullopt = build on the applied
  /// weights.
  std::optional<version_ref> anchor;
  /// Deltas to fold after the anchor (or the applied state), in order.
  std::vector<version_ref> deltas;
  /// Union of the tensors the plan writes (every tensor when seeding).
  std::set<std::string> touched;
  /// False when nothing changes the weights (the tail is all empty deltas): the
  /// version advances without an activation.
  bool activation_needed = false;

  /// Versions the plan moves across (anchor and deltas).
  size_t folded_versions() const noexcept { return deltas.size() + (anchor ? 1 : 0); }

  friend bool operator==(const chain_plan&, const chain_plan&) = default;
};

/// The plan that rebuilds an engine's weights of `ref` from scratch (a
/// rebuild, a reset): its chain from the nearest full anchor, activated.
chain_plan boot_plan(const version_ref& ref);

/// A manifest lookup answers one of three ways.
struct manifest_found {
  const manifest* m;
};
/// The store has no such version: a hole in the chain.
struct manifest_missing {};
/// Not loaded yet; the caller must fetch it and plan again.
struct manifest_pending {};
using manifest_lookup_result = std::variant<manifest_found, manifest_missing, manifest_pending>;
using manifest_lookup = std::function<manifest_lookup_result(const version_ref&)>;

/// The planner needs this manifest before it can finish.
struct needs_manifest {
  version_ref ref;
  friend bool operator==(const needs_manifest&, const needs_manifest&) = default;
};

using plan_outcome = std::variant<chain_plan, needs_manifest>;

/// Plans the tail from `applied` to `pointer`: walks back from the pointer to
/// the applied version, or — when the applied state is absent, unusable, ahead
/// of the pointer or of another run — to the nearest full anchor at or above
/// the run's boot. A chain link the store lacks is a `missing_link` error
/// naming the version; a malformed link (wrong run, wrong base) is
/// `invalid_manifest`. Needs at most one lookup per version in the tail.
result<plan_outcome> plan_chain(const std::optional<applied_state>& applied,
                                const version_ref& pointer, uint64_t boot_version,
                                const manifest_lookup& lookup);

} // namespace stitch
