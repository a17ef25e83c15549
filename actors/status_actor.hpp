#pragma once

#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/cluster_types.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/replica_actor.hpp"
#include "actors/store_actor.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stitch {

/// A listening surface of the status node: role and address.
struct status_listener {
  std::string role;
  std::string address;
};

/// A replica's applied version since a moment (unix ms).
struct status_point {
  int64_t at_ms = 0;
  int64_t version = -1;
};

/// One replica as the status surface follows it.
struct status_replica {
  std::string pool;
  replica_info info;
  int64_t updated_ms = 0;
  /// The applied version at every change, oldest first.
  std::vector<status_point> history;
};

/// One activation as seen from outside.
struct status_update {
  std::string replica;
  std::string version;
  double stage_s = 0;
  double pause_us = 0;
  double drain_ms = 0;
  uint64_t folded = 0;
  int64_t at_ms = 0;
};

/// What the status surface knows, typed: `GET /status` renders it
/// (`status_json`), `stitch status` prints it.
struct status_snapshot {
  int64_t generated_at_ms = 0;
  std::string node;
  std::vector<std::string> roles;
  std::vector<status_listener> listening;
  int64_t up_since_ms = 0;
  /// How the node's CAF traffic travels (`status_options::cluster_transport`).
  std::string cluster_transport;
  /// The coordinator's last view: members, experiments, directory.
  std::optional<cluster_view> cluster;
  std::map<std::string, pointer_record> pointers;
  std::vector<status_replica> replicas;
  /// Newest first.
  std::vector<status_update> recent;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_listener& x) {
  return f(caf::meta::type_name("stitch.status_listener"), x.role, x.address);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_point& x) {
  return f(caf::meta::type_name("stitch.status_point"), x.at_ms, x.version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_replica& x) {
  return f(caf::meta::type_name("stitch.status_replica"), x.pool, x.info, x.updated_ms, x.history);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_update& x) {
  return f(caf::meta::type_name("stitch.status_update"), x.replica, x.version, x.stage_s,
           x.pause_us, x.drain_ms, x.folded, x.at_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_snapshot& x) {
  optional_proxy<cluster_view> cluster{x.cluster};
  return f(caf::meta::type_name("stitch.status_snapshot"), x.generated_at_ms, x.node, x.roles,
           x.listening, x.up_since_ms, x.cluster_transport, cluster.field, x.pointers, x.replicas,
           x.recent, cluster.commit());
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_status, ::stitch::type_ids::status)
CAF_ADD_TYPE_ID(stitch_status, (stitch::status_snapshot))
CAF_ADD_ATOM(stitch_status, stitch::atom, status_view, "statusview")
CAF_ADD_ATOM(stitch_status, stitch::atom, metrics, "metrics")
CAF_END_TYPE_ID_BLOCK(stitch_status)

static_assert(caf::id_block::stitch_status::end <= stitch::type_ids::rollout);

namespace stitch {

/// STATUS: the read-only view of the cluster (DESIGN §2, §5): nodes, runs and
/// pointers, replicas with their applied version over time, transfers in
/// flight, Prometheus metrics. Learns by subscription, never by polling.
using status_actor =
  // Enrollments and the cluster view carry the member capability last
  // (refused without it); replica states count from enrolled replicas only.
  caf::typed_actor<caf::reacts_to<atom::enroll, std::string, replica_actor, std::string>,
                   caf::reacts_to<atom::enroll, gateway_actor, std::string>,
                   caf::reacts_to<atom::replica_state, replica_info>,
                   caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
                   // The coordinator's members, experiments and directory.
                   caf::reacts_to<atom::cluster_view, cluster_view, std::string>,
                   // What `GET /status` renders and `stitch status` prints.
                   caf::replies_to<atom::status_view>::with<status_snapshot>,
                   // `GET /metrics` in the Prometheus text exposition format.
                   caf::replies_to<atom::metrics>::with<std::string>>;

} // namespace stitch
