#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator_actor.hpp"
#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/fanout.hpp"

namespace stitch {

struct coordinator_options {
  /// A member silent this long is removed (its replicas placed elsewhere).
  std::chrono::milliseconds heartbeat_timeout{3000};
  /// When set, submit, scale and stop must carry it.
  std::string admin_token;
  /// When set, every member's message must carry it (the member capability,
  /// `transport::member_capability` of the admin token): joins, enrollments,
  /// offers, the ends of fetches and replicas, trainers' reports. The
  /// coordinator presents it on what it asks of members.
  std::string member_token;
  /// The experiments persisted before a restart (`cluster_plan::restore`),
  /// and how long their nodes have to rejoin with what kept running before
  /// what is missing is placed anew.
  std::vector<experiment_record> restored;
  std::chrono::milliseconds recovery_window{3000};
  /// Called with the experiments whenever they may have changed (placement,
  /// scale, stop, a trainer's end); must not block (the node writes them on
  /// a worker thread). Unset: nothing is persisted.
  std::function<void(std::vector<experiment_record>)> persist;
};

struct coordinator_state {
  static inline const char* name = "coordinator";

  struct member {
    node_agent_actor agent;
    std::chrono::steady_clock::time_point last_heartbeat;
  };
  struct run_progress {
    /// The trainer's last step report, and how it ended ("" while running).
    std::optional<step_report> last_step;
    std::string outcome;
    std::chrono::steady_clock::time_point submitted;
  };

  coordinator_options opts;
  /// Heartbeat checks so far.
  uint64_t ticks = 0;
  /// Counts joins and removals: a node agent that sees it change asks for
  /// the members' mesh addresses again.
  uint64_t membership_epoch = 1;
  std::map<std::string, std::vector<caf::actor>> roles;
  cluster_plan plan;
  std::map<std::string, member> members;
  /// Placed replicas that are up, by replica id.
  std::map<std::string, replica_actor> replicas;
  /// Their last reported state, by replica id: the directory of who holds
  /// which version's bytes.
  std::map<std::string, replica_info> infos;
  std::map<std::string, run_progress> runs;
  /// Replicas nodes started from their own configuration, by address: their
  /// pool and last reported state (none before the first report).
  struct standalone {
    std::string pool;
    std::optional<replica_info> info;
    replica_actor handle;
  };
  std::map<caf::actor_addr, standalone> standalone_replicas;
  /// Who holds or is fetching which version's bytes, and whom each serves
  /// (peer transfer: a relay chain, DESIGN §6).
  holder_directory holders;
  /// Who holds which delta's stored frames (deltas over peers): the
  /// publisher that stored it, replicas that fetched them.
  holder_directory frame_holders;
  /// Holders that are not replicas (publishers), by holder id.
  std::map<std::string, peer_holder_actor> lenders;
};

coordinator_actor::behavior_type
coordinator(coordinator_actor::stateful_pointer<coordinator_state> self,
            coordinator_options opts = {});

} // namespace stitch
