#pragma once

// Reaching actors on other nodes: publishing and connecting over CAF's
// middleman, with TLS (CAF's OpenSSL module) when the actor system was
// configured with certificates, and blocking requests for threads that are
// not actors (the CLI, node startup, trainer threads).

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "actors/coordinator_actor.hpp"
#include "node/cli.hpp"
#include "runtime/core/error.hpp"

namespace stitch::node {

/// True when the actor system loaded the OpenSSL module with certificates
/// (`system_config::use_tls`): every inter-node connection is then mutual TLS.
bool tls_enabled(caf::actor_system& sys);

/// Publishes the coordinator on `host:port` (0 picks a free port); answers the port.
result<uint16_t> publish_coordinator(caf::actor_system& sys, const coordinator_actor& whom,
                                     uint16_t port, const std::string& host);

/// Publishes the node's mesh anchor (an actor that only marks the port) on
/// `host:port`, TLS with the OpenSSL module: other nodes connect there to
/// reach this node directly. Answers the port.
result<uint16_t> publish_mesh_anchor(caf::actor_system& sys, const caf::actor& anchor,
                                     uint16_t port, const std::string& host);

/// The address other nodes use to reach a listener bound to `bind_host`:
/// itself, or for a wildcard (0.0.0.0, ::, empty) the local address this
/// machine reaches `toward_host` from (the interface its traffic to the
/// coordinator leaves by).
result<std::string> advertised_host(const std::string& bind_host, const std::string& toward_host);

/// The middleman actor that connects to other nodes (the OpenSSL one with
/// TLS): the node agent reconnects to a lost coordinator through it.
caf::actor node_connector(caf::actor_system& sys);

/// Connects to the coordinator at `where` (one attempt).
result<coordinator_actor> connect_coordinator(caf::actor_system& sys, const host_port& where);

/// A blocking request from a thread that is not an actor. It fails at once
/// when `whom` goes away (its node died: a request already sent would
/// otherwise wait out `timeout`), else with the answer, the error or the
/// timeout.
template <class T, class Handle, class... Ts>
result<T> ask_actor(caf::actor_system& sys, const Handle& whom, caf::timespan timeout, Ts&&... xs) {
  auto answer = std::make_shared<std::promise<result<T>>>();
  auto got = answer->get_future();
  auto target = caf::actor_cast<caf::actor>(whom);
  sys.spawn([answer, target, timeout, msg = caf::make_message(std::forward<Ts>(xs)...),
             &sys](caf::event_based_actor* self) {
    auto told = std::make_shared<bool>(false);
    auto tell = [answer, told, self](result<T> r) {
      if (*told)
        return;
      *told = true;
      answer->set_value(std::move(r));
      self->quit();
    };
    self->set_down_handler([tell, &sys](caf::down_msg& down) {
      tell(make_error(errc::engine_unavailable,
                      "the actor asked went away (" + sys.render(down.reason) + ")"));
    });
    self->monitor(target);
    self->request(target, timeout, msg)
      .then([tell](T& value) { tell(std::move(value)); },
            [tell, &sys](caf::error& err) { tell(from_caf_error(sys, err)); });
  });
  return got.get();
}

} // namespace stitch::node
