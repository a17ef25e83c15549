#pragma once

#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/cluster_types.hpp"
#include "actors/replica_actor.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(stitch_node_agent, ::stitch::type_ids::node_agent)
CAF_ADD_ATOM(stitch_node_agent, stitch::atom, spawn, "spawn")
CAF_ADD_ATOM(stitch_node_agent, stitch::atom, train, "train")
CAF_ADD_ATOM(stitch_node_agent, stitch::atom, stop, "stop")
CAF_END_TYPE_ID_BLOCK(stitch_node_agent)

static_assert(caf::id_block::stitch_node_agent::end <= stitch::type_ids::coordinator);

namespace stitch {

/// NODE AGENT: a node's member of the cluster. Joins the coordinator with the
/// node's roles and slots, sends heartbeats, and carries out what the
/// coordinator places on the node: replicas (spawned, retired after a drain)
/// and the built-in trainer of an experiment.
using node_agent_actor = caf::typed_actor<
  // What the coordinator asks carries the member capability as its last
  // string (refused without it).
  //
  // Spawns a replica of the experiment on the placement's slot.
  caf::replies_to<atom::spawn, placement, experiment_spec, std::string>::with<replica_actor>,
  // Asks the named replica to drain and leave.
  caf::reacts_to<atom::retire, std::string, std::string>,
  // Starts the experiment's trainer and rollout driver against the gateway at
  // `host:port`.
  caf::reacts_to<atom::train, experiment_spec, std::string, std::string>,
  // Stops the trainer of a run.
  caf::reacts_to<atom::stop, std::string, std::string>,
  // Internal: (re)join and heartbeat timer (only from itself); a trainer's
  // progress and end (from the node's trainer threads, with the
  // capability).
  caf::reacts_to<atom::tick>, caf::reacts_to<atom::progress, std::string, step_report, std::string>,
  caf::reacts_to<atom::trained, std::string, std::string, std::string>>;

} // namespace stitch
