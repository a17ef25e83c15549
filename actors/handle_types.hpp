#pragma once

// Type IDs of the typed actor handles that travel in messages between nodes
// (a placed replica handed to gateways, a node agent joining). A block of its
// own after `stitch`'s: the handles' interfaces name the message types.

#include <caf/type_id.hpp>

#include "actors/node_agent_actor.hpp"
#include "actors/replica_actor.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(stitch_handles, ::stitch::type_ids::handles)
CAF_ADD_TYPE_ID(stitch_handles, (stitch::replica_actor))
CAF_ADD_TYPE_ID(stitch_handles, (stitch::node_agent_actor))
// A hub relay's new target (`actors/hub_relay.hpp`; local only).
CAF_ADD_ATOM(stitch_handles, stitch::atom, rebind, "rebind")
CAF_END_TYPE_ID_BLOCK(stitch_handles)

static_assert(caf::id_block::stitch_handles::end <= stitch::type_ids::store);
