#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace stitch {

/// ROLLOUT DRIVER (built-in): the demo's rollout client as a service on its
/// own node (DESIGN §2). A trainer asks for a batch of constrained rollouts;
/// the driver samples them through the gateway and sends them back, checked
/// against their constraint.
using rollout_driver_actor = caf::typed_actor<
  caf::replies_to<atom::rollouts, rollout_request>::with<std::vector<engine::rollout_result>>,
  // Internal: a worker finished batch `id`.
  caf::reacts_to<atom::generated, uint64_t, std::vector<engine::rollout_result>>>;

} // namespace stitch
