#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/gateway_actor.hpp"
#include "actors/messages.hpp"
#include "actors/replica_actor.hpp"
#include "actors/store_actor.hpp"

namespace stitch {

/// STATUS: the read-only view of the cluster (DESIGN §2, §5): nodes, runs and
/// pointers, replicas with their applied version over time, transfers in
/// flight, Prometheus metrics. Learns by subscription, never by polling.
using status_actor =
  caf::typed_actor<caf::reacts_to<atom::enroll, std::string, replica_actor>,
                   caf::reacts_to<atom::enroll, gateway_actor>,
                   caf::reacts_to<atom::replica_state, replica_info>,
                   caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
                   // The coordinator's members and experiments (JSON).
                   caf::reacts_to<atom::cluster_view, std::string>,
                   // `GET /status` as JSON.
                   caf::replies_to<atom::status_view>::with<std::string>,
                   // `GET /metrics` in the Prometheus text exposition format.
                   caf::replies_to<atom::metrics>::with<std::string>>;

} // namespace stitch
