#pragma once

#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/cluster_types.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/replica_actor.hpp"
#include "actors/store_actor.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(stitch_status, ::stitch::type_ids::status)
CAF_ADD_ATOM(stitch_status, stitch::atom, status_view, "statusview")
CAF_ADD_ATOM(stitch_status, stitch::atom, metrics, "metrics")
CAF_END_TYPE_ID_BLOCK(stitch_status)

static_assert(caf::id_block::stitch_status::end <= stitch::type_ids::rollout);

namespace stitch {

/// STATUS: the read-only view of the cluster (DESIGN §2, §5): nodes, runs and
/// pointers, replicas with their applied version over time, transfers in
/// flight, Prometheus metrics. Learns by subscription, never by polling.
using status_actor =
  caf::typed_actor<caf::reacts_to<atom::enroll, std::string, replica_actor>,
                   caf::reacts_to<atom::enroll, gateway_actor>,
                   caf::reacts_to<atom::replica_state, replica_info>,
                   caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
                   // The coordinator's members, experiments and directory.
                   caf::reacts_to<atom::cluster_view, cluster_view>,
                   // `GET /status` as JSON.
                   caf::replies_to<atom::status_view>::with<std::string>,
                   // `GET /metrics` in the Prometheus text exposition format.
                   caf::replies_to<atom::metrics>::with<std::string>>;

} // namespace stitch
