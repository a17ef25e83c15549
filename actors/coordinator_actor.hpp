#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace stitch {

/// COORDINATOR: the cluster's front desk. For now its directory of which
/// actor serves which role; membership, experiments and placement extend it.
using coordinator_actor = caf::typed_actor<
  // Answers the actor serving `role` ("store", "publisher").
  caf::replies_to<atom::lookup, std::string>::with<caf::actor>,
  // Records that `handle` serves `role`.
  caf::reacts_to<atom::enroll, std::string, caf::actor>>;

} // namespace stitch
