#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
  /// The runs whose trainer runs on this node now (reported as it joins).
  std::function<std::vector<std::string>()> running_trainers;
  /// The coordinator is gone (`nullptr`) or reached again: the node points
  /// its relays (DESIGN §2: every hub role a node uses goes through one) at
  /// it.
  std::function<void(const coordinator_actor&)> coordinator_changed;
};

/// Where the agent finds the coordinator again after losing it: the
/// middleman (`caf::io::middleman_actor`, the OpenSSL one with TLS) it asks
/// to connect to `host:port`. Without one, a lost coordinator stays lost.
/// `member_token`: the member capability the agent presents to the
/// coordinator and requires on what the coordinator asks of it.
struct coordinator_address {
  caf::actor connector;
  std::string host;
  uint16_t port = 0;
  std::string member_token;
};

struct node_agent_state {
  static inline const char* name = "node-agent";

  member_info me;
  /// Null while the coordinator is lost.
  coordinator_actor coordinator;
  coordinator_address address;
  node_agent_hooks hooks;
  bool joined = false;
  /// A join or connect request is out.
  bool asking = false;
  /// Successful joins so far (the first is the node's start).
  uint64_t joins = 0;
  /// Reconnect attempts since the coordinator was lost (for the backoff).
  uint32_t attempts = 0;
  std::chrono::milliseconds heartbeat{500};
  /// Replicas this node hosts: address -> replica id.
  std::map<caf::actor_addr, std::string> replicas;
  std::map<std::string, replica_actor> by_id;
  /// Where each was placed (reported as it rejoins), by replica id.
  std::map<std::string, placement> placed;
  /// Asked to retire: not reported as running.
  std::set<std::string> retiring;
  /// Trainer ends that happened while the coordinator was away, told once
  /// the node has joined again: (run, outcome).
  std::vector<std::pair<std::string, std::string>> untold;
  /// The node mesh (only with a connector: nodes without the coordinator).
  /// The membership epoch last connected for; the peers reached directly
  /// (node name -> the actor at their mesh port, monitored: its loss means
  /// the connection's); connections being made; peers whose last attempt
  /// failed (logged once until one succeeds).
  uint64_t mesh_epoch = 0;
  bool mesh_asking = false;
  std::map<std::string, caf::actor> mesh_peers;
  std::set<std::string> mesh_connecting;
  std::set<std::string> mesh_failing;
};

/// Joins `coordinator` as `me` (retrying while the coordinator still knows a
/// previous incarnation of the name), then sends heartbeats. When the
/// coordinator is lost (its node died or restarted), reconnects to
/// `address` with backoff and joins again with what the node still runs.
/// With a connector it also keeps the node mesh: whenever the membership
/// changes it connects directly to every member whose name sorts after its
/// own (one connection per pair) that has a mesh address and is not the
/// hub's node, and reconnects when such a connection drops, so traffic
/// between nodes never needs the hub (and survives its restart).
node_agent_actor::behavior_type
node_agent(node_agent_actor::stateful_pointer<node_agent_state> self, member_info me,
           coordinator_actor coordinator, node_agent_hooks hooks, coordinator_address address);

} // namespace stitch
