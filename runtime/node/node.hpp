#pragma once

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include <string>
#include <vector>

#include "actors/coordinator_actor.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/replica_actor.hpp"
#include "actors/status_actor.hpp"
#include "actors/store_actor.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/node/cli.hpp"

namespace stitch {
class replica_http;
class gateway_http;
class status_http;
} // namespace stitch

namespace stitch::node {

/// Where a node's HTTP surfaces listen (ports resolved).
struct listening {
  uint16_t gateway = 0;
  uint16_t status = 0;
  std::vector<uint16_t> replicas;
};

/// The roles one node hosts on its actor system. For now the single-machine
/// default: coordinator, store, publisher, built-in engine replicas of pool
/// `default`, gateway and status, each HTTP surface on its own port.
class node {
public:
  /// Opens the store, spawns the actors and publishes the coordinator on
  /// `settings.coordinator` (port 0 picks a free one; see `port()`).
  static result<std::unique_ptr<node>> start(caf::actor_system& sys, const node_settings& settings);
  ~node();

  uint16_t port() const noexcept { return port_; }
  const listening& http() const noexcept { return http_; }
  /// Stops every actor of the node.
  void stop();

private:
  explicit node(caf::actor_system& sys);
  /// Replicas, gateway and status with their HTTP surfaces.
  status start_serving(std::shared_ptr<store_backend> backend, const node_settings& settings);

  caf::actor_system& sys_;
  store_actor store_;
  publisher_actor publisher_;
  coordinator_actor coordinator_;
  std::vector<replica_actor> replicas_;
  gateway_actor gateway_;
  status_actor status_;
  std::vector<std::unique_ptr<replica_http>> replica_fronts_;
  std::unique_ptr<gateway_http> gateway_front_;
  std::unique_ptr<status_http> status_front_;
  uint16_t port_ = 0;
  listening http_;
};

} // namespace stitch::node
