#pragma once

#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/cluster_types.hpp"
#include "actors/node_agent_actor.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(stitch_coordinator, ::stitch::type_ids::coordinator)
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, join, "join")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, heartbeat, "heartbeat")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, submit, "submit")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, scale, "scale")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, replica_down, "repldown")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, recovered, "recovered")
CAF_ADD_ATOM(stitch_coordinator, stitch::atom, mesh, "mesh")
CAF_END_TYPE_ID_BLOCK(stitch_coordinator)

static_assert(caf::id_block::stitch_coordinator::end <= stitch::type_ids::status);

namespace stitch {

/// COORDINATOR: the cluster's front desk (DESIGN §2): the directory of which
/// actor serves which role, membership (nodes, roles, slots, heartbeats),
/// experiments and the placement of their replicas and trainers.
using coordinator_actor = caf::typed_actor<
  // Answers the actor serving `role` ("store", "publisher", "status").
  caf::replies_to<atom::lookup, std::string>::with<caf::actor>,
  // Every message of a member's below that changes the directory, the
  // membership or placement carries the member capability as its last string
  // (`transport::member_capability`, docs/security.md); one without it is
  // refused (an error to a request, logged and dropped otherwise).
  //
  // The directory of version bytes (peer transfer): holders of `version` of
  // `pool` chosen for the receiver named by the next two strings (replica
  // id, node), its primary first, then backups (`holder_directory`); from
  // now on the receiver is listed as a partial holder of `version`. The
  // bool asks for the holders of the delta's stored frames instead of its
  // full tensors (a second directory: deltas over peers).
  caf::replies_to<atom::lookup, std::string, version_ref, std::string, std::string, bool,
                  std::string>::with<std::vector<holder_entry>>,
  // The receiver's fetch of (pool, version) ended (`true`: it fetched every
  // tensor it asked the peers for; then whether it fetched frames).
  caf::reacts_to<atom::done, std::string, version_ref, std::string, bool, bool, std::string>,
  // A publisher lends a run's remembered version (false) or a delta's
  // stored frames (true), or stops (`holder_registry_actor`).
  caf::reacts_to<atom::offer, std::string, version_ref, std::string, std::string, peer_holder_actor,
                 bool, std::string>,
  caf::reacts_to<atom::release, std::string, std::string, std::string>,
  // Records that `handle` serves `role` (several may: every gateway and
  // status actor learns of placed replicas).
  caf::reacts_to<atom::enroll, std::string, caf::actor, std::string>,
  // A replica a node started from its own configuration (not placed): the
  // coordinator follows its state like a placed one's, for the directory.
  caf::reacts_to<atom::enroll, std::string, replica_actor, std::string>,
  // The versions the replicas of `pool` serve or are moving to (what
  // retention must keep, `versions_in_use`).
  caf::replies_to<atom::in_use, std::string>::with<std::vector<version_ref>>,
  // A node joins with its roles and slots, and what it runs already (after a
  // coordinator restart: adopted or retired, `cluster_plan::join`); answers
  // the heartbeat interval in milliseconds. Refused while a member of that
  // name is alive.
  caf::replies_to<atom::join, member_info, member_holdings, node_agent_actor,
                  std::string>::with<uint64_t>,
  // A member's heartbeat; answers the membership epoch (it changes with
  // every join and removal), or 0 to a node it no longer counts as a member
  // (removed after missed heartbeats), which then joins again.
  caf::replies_to<atom::heartbeat, std::string>::with<uint64_t>,
  // The members that accept direct connections, with their mesh addresses
  // (`node_view::mesh`): node agents connect to them (the node mesh).
  caf::replies_to<atom::mesh>::with<std::vector<node_view>>,
  // `stitch submit`, `stitch scale`, `stitch stop` (the last string is the
  // admin token); each answers a one-line summary or the reason it refused.
  caf::replies_to<atom::submit, experiment_spec, std::string>::with<std::string>,
  caf::replies_to<atom::scale, std::string, uint32_t, std::string>::with<std::string>,
  caf::replies_to<atom::stop, std::string, std::string>::with<std::string>,
  // `stitch profile`: the replica named by the first string, placed or
  // standalone (the second is the admin token).
  caf::replies_to<atom::profile, std::string, std::string>::with<replica_actor>,
  // Members, experiments and the version directory (`stitch status`).
  caf::replies_to<atom::cluster_view>::with<cluster_view>,
  // From replicas the coordinator subscribed to: their state (from any
  // other sender it is ignored).
  caf::reacts_to<atom::replica_state, replica_info>,
  // From node agents: a placed replica is gone.
  caf::reacts_to<atom::replica_down, std::string, std::string>,
  // From trainers (through their node's agent): a step's report and the end
  // (empty = finished).
  caf::reacts_to<atom::progress, std::string, step_report, std::string>,
  caf::reacts_to<atom::trained, std::string, std::string, std::string>,
  // Internal (only from itself): the heartbeat check; the end of the
  // recovery window after a restart (what restored experiments miss is
  // placed then).
  caf::reacts_to<atom::tick>, caf::reacts_to<atom::recovered>>;

} // namespace stitch
