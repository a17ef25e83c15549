#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/status_actor.hpp"
#include "actors/store_actor.hpp"

namespace stitch {

struct status_options {
  std::string node = "local";
  std::vector<std::string> roles;
  /// Role -> listen address, for `/status`.
  std::vector<std::pair<std::string, std::string>> listening;
  /// Pools whose pointers are watched.
  std::vector<std::string> pools = {"default"};
  /// Points of applied-version history kept per replica.
  size_t history = 600;
  /// How this node's CAF traffic travels ("mutual TLS", "plain (loopback
  /// only)", "plain, cluster.insecure"): `/status` shows it.
  std::string cluster_transport;
  /// The member capability enrollments and the coordinator's view must
  /// carry (empty: none).
  std::string member_token;
};

struct status_state {
  static inline const char* name = "status";

  struct replica_entry {
    replica_actor handle;
    std::string pool;
    replica_info info;
    bool known = false;
    /// (unix ms, applied version) at every change.
    std::deque<std::pair<int64_t, int64_t>> history;
    int64_t updated_ms = 0;
  };

  status_options opts;
  store_actor store;
  std::map<caf::actor_addr, replica_entry> replicas;
  std::map<std::string, pointer_record> pointers;
  std::vector<gateway_actor> gateways;
  /// Pools whose pointer is followed.
  std::set<std::string> watched;
  /// The coordinator's last view: members, experiments, directory.
  std::optional<cluster_view> cluster;
  std::deque<status_update> recent;
  histogram stage_seconds;
  histogram pause_seconds;
  int64_t started_ms = 0;
};

status_actor::behavior_type status_service(status_actor::stateful_pointer<status_state> self,
                                           status_options opts, store_actor store);

/// The coordinator's view as JSON (`stitch status --json`'s `cluster`).
std::string cluster_json(const cluster_view& c);
/// What a state knows, as the status actor answers it.
status_snapshot snapshot_of(const status_state& st);
/// The body of `GET /status` (and `stitch status --json`, with `cluster`).
std::string status_json(const status_snapshot& s);
/// The body of `GET /metrics` for a state and the gateways' measurements.
std::string prometheus_text(const status_state& st, const std::vector<gateway_stats>& gateways);
/// The dashboard: one HTML page, no external assets, refreshing itself.
const std::string& dashboard_html();

} // namespace stitch
