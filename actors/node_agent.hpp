#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "actors/coordinator_actor.hpp"
#include "actors/node_agent_actor.hpp"

namespace stitch {

/// What the node does for its agent: the agent is the thin actor shell, the
/// node owns HTTP fronts, engines and trainer threads.
struct node_agent_hooks {
  /// Spawns a replica actor (and its HTTP surface) for the placement.
  std::function<result<replica_actor>(const placement&, const experiment_spec&)> spawn_replica;
  /// A replica of this node is gone: release what the node kept for it.
  std::function<void(const std::string& replica_id)> replica_gone;
  /// Starts a run's trainer on its own thread; it reports through `agent`
  /// (`progress` per step, `trained` at the end).
  std::function<status(const experiment_spec&, const std::string& gateway, node_agent_actor agent)>
    start_trainer;
  /// The node joined again after the coordinator removed it: enroll its
  /// roles again (the coordinator dropped them with the member).
  std::function<void()> rejoined;
  /// Asks a run's trainer to stop after its current step.
  std::function<void(const std::string& run)> stop_trainer;
};

struct node_agent_state {
  static inline const char* name = "node-agent";

  member_info me;
  coordinator_actor coordinator;
  node_agent_hooks hooks;
  bool joined = false;
  /// Successful joins so far (the first is the node's start).
  uint64_t joins = 0;
  /// The coordinator is gone: no more joining.
  bool lost = false;
  std::chrono::milliseconds heartbeat{500};
  /// Replicas this node hosts: address -> replica id.
  std::map<caf::actor_addr, std::string> replicas;
  std::map<std::string, replica_actor> by_id;
};

/// Joins `coordinator` as `me` (retrying while the coordinator still knows a
/// previous incarnation of the name), then sends heartbeats.
node_agent_actor::behavior_type
node_agent(node_agent_actor::stateful_pointer<node_agent_state> self, member_info me,
           coordinator_actor coordinator, node_agent_hooks hooks);

} // namespace stitch
