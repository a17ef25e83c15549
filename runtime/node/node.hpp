#pragma once

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include "actors/coordinator_actor.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/store_actor.hpp"
#include "runtime/core/error.hpp"
#include "runtime/node/cli.hpp"

namespace stitch::node {

/// The roles one node hosts on its actor system. For now: coordinator, store
/// and publisher on one node (the single-machine default).
class node {
public:
  /// Opens the store, spawns the actors and publishes the coordinator on
  /// `settings.coordinator` (port 0 picks a free one; see `port()`).
  static result<std::unique_ptr<node>> start(caf::actor_system& sys, const node_settings& settings);
  ~node();

  uint16_t port() const noexcept { return port_; }
  /// Stops every actor of the node.
  void stop();

private:
  explicit node(caf::actor_system& sys) : sys_(sys) {}

  caf::actor_system& sys_;
  store_actor store_;
  publisher_actor publisher_;
  coordinator_actor coordinator_;
  uint16_t port_ = 0;
};

} // namespace stitch::node
