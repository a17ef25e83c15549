#pragma once

// The cluster's shared values (DESIGN §2): what a node joins with, what an
// experiment asks for, where its replicas are placed, how its trainer
// progresses, and the coordinator's typed view of all of it (members,
// experiments, the directory of who holds which version). Their `inspect`
// overloads and type-ID block; the atoms the coordinator, node agents and
// status use for them.

#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/value_types.hpp"
#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/reconciler.hpp"

namespace stitch {

/// A node of the cluster as the coordinator knows it.
struct node_view {
  std::string name;
  std::vector<std::string> roles;
  std::vector<uint32_t> slots;
  /// Where its gateway listens (`host:port`); empty without one.
  std::string gateway;
  /// Since its last heartbeat; none for the coordinator's own entry.
  std::optional<int64_t> last_heartbeat_ms;
  /// Where other nodes connect to it directly (`member_info::mesh`).
  std::string mesh = {};
};

/// A placed replica and what it last reported.
struct placed_replica_view {
  std::string replica_id;
  std::string node;
  uint32_t slot = 0;
  /// Its actor is up (it answered the spawn and has not gone down).
  bool up = false;
  /// It reported at least once; the fields below are its last report.
  bool known = false;
  bool ready = false;
  std::optional<version_ref> applied;
  sync_state state = sync_state::idle;
};

/// An experiment, its placements and its trainer.
struct experiment_status {
  std::string run_id;
  std::string pool;
  uint32_t replicas_wanted = 0;
  std::string commit_mode;
  std::vector<placed_replica_view> replicas;
  /// Empty: no trainer placed.
  std::string trainer_node;
  /// Why fewer replicas than wanted are placed (empty when none short).
  std::string shortfall;
  std::optional<step_report> last_step;
  /// Empty while the trainer runs; "finished", "stopped" or "failed: ...".
  std::string trainer_outcome;
};

/// The nodes whose replicas of `pool` serve `version` (peer transfer).
struct version_holders {
  std::string pool;
  version_ref version;
  std::vector<std::string> nodes;
};

/// The coordinator's view of the cluster (`stitch status`, the dashboard).
struct cluster_view {
  std::vector<node_view> nodes;
  std::vector<experiment_status> experiments;
  std::vector<version_holders> directory;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("stitch.member_info"), x.name, x.roles, x.slots, x.gateway_http,
           x.mesh);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trainer_spec& x) {
  return f(caf::meta::type_name("stitch.trainer_spec"), x.enabled, x.steps, x.samples_per_step,
           x.staleness, x.learning_rate);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, experiment_spec& x) {
  return f(caf::meta::type_name("stitch.experiment_spec"), x.run_id, x.pool, x.replicas,
           x.commit_mode, x.boot_preset, x.boot_seed, x.boot_dir, x.boot_version, x.trainer);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement& x) {
  return f(caf::meta::type_name("stitch.placement"), x.replica_id, x.run_id, x.pool, x.node, x.slot,
           x.retiring);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_holdings& x) {
  return f(caf::meta::type_name("stitch.member_holdings"), x.replicas, x.trainers);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_report& x) {
  return f(caf::meta::type_name("stitch.step_report"), x.step, x.version, x.reward, x.samples,
           x.staleness_mean, x.staleness_max, x.pause_us, x.constraint_violations);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_view& x) {
  optional_proxy<int64_t> heartbeat{x.last_heartbeat_ms};
  return f(caf::meta::type_name("stitch.node_view"), x.name, x.roles, x.slots, x.gateway,
           heartbeat.field, x.mesh, heartbeat.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placed_replica_view& x) {
  optional_proxy<version_ref> applied{x.applied};
  return f(caf::meta::type_name("stitch.placed_replica_view"), x.replica_id, x.node, x.slot, x.up,
           x.known, x.ready, applied.field, x.state, applied.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, experiment_status& x) {
  optional_proxy<step_report> step{x.last_step};
  return f(caf::meta::type_name("stitch.experiment_status"), x.run_id, x.pool, x.replicas_wanted,
           x.commit_mode, x.replicas, x.trainer_node, x.shortfall, step.field, x.trainer_outcome,
           step.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, version_holders& x) {
  return f(caf::meta::type_name("stitch.version_holders"), x.pool, x.version, x.nodes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_view& x) {
  return f(caf::meta::type_name("stitch.cluster_view"), x.nodes, x.experiments, x.directory);
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_cluster, ::stitch::type_ids::cluster)
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::member_info))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::trainer_spec))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::experiment_spec))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::placement))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::step_report))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::node_view))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::placed_replica_view))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::experiment_status))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::version_holders))
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::cluster_view))
CAF_ADD_TYPE_ID(stitch_cluster, (std::vector<stitch::node_view>) )
CAF_ADD_TYPE_ID(stitch_cluster, (std::vector<stitch::placed_replica_view>) )
CAF_ADD_TYPE_ID(stitch_cluster, (std::vector<stitch::experiment_status>) )
CAF_ADD_TYPE_ID(stitch_cluster, (std::vector<stitch::version_holders>) )
CAF_ADD_TYPE_ID(stitch_cluster, (stitch::member_holdings))
CAF_ADD_TYPE_ID(stitch_cluster, (std::vector<stitch::placement>) )
// The coordinator's view, asked for and pushed to status actors.
CAF_ADD_ATOM(stitch_cluster, stitch::atom, cluster_view, "clusterv")
// A trainer's step and its end (node agent -> coordinator).
CAF_ADD_ATOM(stitch_cluster, stitch::atom, progress, "progress")
CAF_ADD_ATOM(stitch_cluster, stitch::atom, trained, "trained")
CAF_END_TYPE_ID_BLOCK(stitch_cluster)

static_assert(caf::id_block::stitch_cluster::end <= stitch::type_ids::handles);
