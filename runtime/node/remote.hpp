#pragma once

// Reaching actors on other nodes: publishing and connecting over CAF's
// middleman, with TLS (CAF's OpenSSL module) when the actor system was
// configured with certificates, and blocking requests for threads that are
// not actors (the CLI, node startup, trainer threads).

#include <caf/actor.hpp>
#include <caf/scoped_actor.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "actors/coordinator_actor.hpp"
#include "runtime/core/error.hpp"
#include "runtime/node/cli.hpp"

namespace stitch::node {

/// True when the actor system loaded the OpenSSL module with certificates
/// (`system_config::use_tls`): every inter-node connection is then mutual TLS.
bool tls_enabled(caf::actor_system& sys);

/// Publishes the coordinator on `host:port` (0 picks a free port); answers the port.
result<uint16_t> publish_coordinator(caf::actor_system& sys, const coordinator_actor& whom,
                                     uint16_t port, const std::string& host);

/// The middleman actor that connects to other nodes (the OpenSSL one with
/// TLS): the node agent reconnects to a lost coordinator through it.
caf::actor node_connector(caf::actor_system& sys);

/// Connects to the coordinator at `where` (one attempt).
result<coordinator_actor> connect_coordinator(caf::actor_system& sys, const host_port& where);

/// A blocking request from a thread that is not an actor.
template <class T, class Handle, class... Ts>
result<T> ask_actor(caf::actor_system& sys, const Handle& whom, caf::timespan timeout, Ts&&... xs) {
  caf::scoped_actor self{sys};
  std::optional<result<T>> out;
  self->request(whom, timeout, std::forward<Ts>(xs)...)
    .receive([&](T& value) { out.emplace(std::move(value)); },
             [&](caf::error& err) { out.emplace(from_caf_error(sys, err)); });
  return std::move(*out);
}

} // namespace stitch::node
