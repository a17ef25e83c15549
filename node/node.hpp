#pragma once

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include <string>
#include <vector>

#include "actors/coordinator_actor.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/node_agent_actor.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/replica.hpp"
#include "actors/status_actor.hpp"
#include "actors/store_actor.hpp"
#include "node/cli.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"

namespace stitch {
struct coordinator_options;
} // namespace stitch

namespace stitch {
class replica_http;
class gateway_http;
class status_http;
class publisher_http;
} // namespace stitch

namespace stitch::node {

/// Where a node's HTTP surfaces listen (ports resolved).
struct listening {
  uint16_t gateway = 0;
  uint16_t status = 0;
  /// 0 when `publisher.listen` is not set.
  uint16_t publisher = 0;
  std::vector<uint16_t> replicas;
};

/// The roles one node hosts on its actor system (DESIGN §2). A node with the
/// role `coordinator` publishes it on `coordinator.listen`; any other node
/// joins the one at `coordinator.address`. Every node has a node agent that
/// joins the coordinator with its roles and slots, sends heartbeats and
/// hosts what the coordinator places on it (replicas, trainers). `replicas`
/// static replicas of `replica.pool` start with the node (the single-machine
/// default); replicas of experiments go on the slots of `gpus`.
class node {
public:
  /// Opens or finds the store, spawns the actors and joins the cluster.
  static result<std::unique_ptr<node>> start(caf::actor_system& sys, const node_settings& settings);
  ~node();

  /// The coordinator's port on this node (0 when it joined another).
  uint16_t port() const noexcept { return port_; }
  /// Where other nodes connect to this one directly (empty on the hub's node).
  const std::string& mesh() const noexcept { return mesh_; }
  const listening& http() const noexcept { return http_; }
  /// Stops the trainers, then every actor of the node.
  void stop();

private:
  struct jobs;
  explicit node(caf::actor_system& sys);
  /// Replicas, gateway and status with their HTTP surfaces.
  status start_serving(const node_settings& settings);
  /// Tells the coordinator which roles this node serves (again after a rejoin).
  void enroll_roles();
  status join_cluster(const node_settings& settings);
  /// Loads what the coordinator persisted before a restart into `co`, and
  /// has it persist there from now on (`data_dir/coordinator/`).
  status recover_experiments(coordinator_options& co);
  /// A replica and its HTTP surface on `http_port` (0: any); the port it
  /// got goes to `bound` when given.
  /// `gpus`: its GPU slots (an external engine's `{gpu}`).
  result<replica_actor> spawn_replica(const replica_options& o, const std::string& preset,
                                      uint16_t http_port, std::vector<uint32_t> gpus,
                                      uint16_t* bound = nullptr);
  /// How a replica makes its engine: the built-in one of `preset`, or the
  /// adapter of the configured external engine (made once per replica, so a
  /// rebuild re-syncs the same engine).
  result<engine_factory> engine_for(const replica_options& o, const std::string& preset,
                                    std::vector<uint32_t> gpus);

  caf::actor_system& sys_;
  node_settings settings_;
  std::shared_ptr<store_backend> backend_;
  store_actor store_;
  bool owns_store_ = false;
  publisher_actor publisher_;
  /// The coordinator as this node's actors reach it: the hub's own, or a
  /// relay to the remote one (`actors/hub_relay.hpp`), which the agent holds
  /// directly (`coordinator_remote_`) to notice it is gone.
  coordinator_actor coordinator_;
  coordinator_actor coordinator_remote_;
  /// The relays this node spawned (stopped with it).
  std::vector<caf::actor> relays_;
  bool owns_coordinator_ = false;
  host_port coordinator_at_;
  /// Where other nodes connect to this one directly (`host:port`; empty on
  /// the hub's node, which they reach at its coordinator's port), and the
  /// actor published there.
  std::string mesh_;
  caf::actor mesh_anchor_;
  node_agent_actor agent_;
  std::vector<replica_actor> replicas_;
  gateway_actor gateway_;
  status_actor status_;
  caf::actor rollout_driver_;
  std::unique_ptr<gateway_http> gateway_front_;
  std::unique_ptr<status_http> status_front_;
  std::unique_ptr<publisher_http> publisher_front_;
  std::unique_ptr<jobs> jobs_;
  /// The UCX worker this node's replicas fetch and serve peers through
  /// (null: `transfer.peers = "off"` or UCX unavailable).
  std::shared_ptr<transport::ucx::worker> ucx_;
  /// What replicas say about it in `server_info`.
  std::string transport_ = "store only";
  uint16_t port_ = 0;
  listening http_;
};

} // namespace stitch::node
