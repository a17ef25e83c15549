#pragma once

// Where each type-ID block of Stitch starts. Blocks have fixed, disjoint
// ranges (each checks that it ends before the next begins) instead of a
// chain, so a role's interface header includes only the blocks it uses and a
// change to one role's messages rebuilds only that role's users.

#include <caf/type_id.hpp>

namespace stitch::type_ids {

/// Shared value types (`actors/value_types.hpp`).
inline constexpr caf::type_id_t values = caf::first_custom_type_id;
/// The cluster's shared values (`actors/cluster_types.hpp`).
inline constexpr caf::type_id_t cluster = values + 100;
/// Typed handles that travel between nodes (`actors/handle_types.hpp`).
inline constexpr caf::type_id_t handles = values + 200;
/// STORE (`actors/store_actor.hpp`).
inline constexpr caf::type_id_t store = values + 220;
/// PUBLISHER (`actors/publisher_actor.hpp`).
inline constexpr caf::type_id_t publisher = values + 260;
/// REPLICA (`actors/replica_actor.hpp`).
inline constexpr caf::type_id_t replica = values + 300;
/// GATEWAY (`actors/gateway_actor.hpp`).
inline constexpr caf::type_id_t gateway = values + 340;
/// NODE AGENT (`actors/node_agent_actor.hpp`).
inline constexpr caf::type_id_t node_agent = values + 360;
/// COORDINATOR (`actors/coordinator_actor.hpp`).
inline constexpr caf::type_id_t coordinator = values + 380;
/// STATUS (`actors/status_actor.hpp`).
inline constexpr caf::type_id_t status = values + 400;
/// ROLLOUT DRIVER (`actors/rollout_driver_actor.hpp`).
inline constexpr caf::type_id_t rollout = values + 420;
/// One past the last ID Stitch uses.
inline constexpr caf::type_id_t end = values + 440;

} // namespace stitch::type_ids
