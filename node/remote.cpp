#include "node/remote.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/all.hpp>

namespace stitch::node {

bool tls_enabled(caf::actor_system& sys) {
  return sys.has_openssl_manager() && !sys.config().openssl_certificate.empty();
}

result<uint16_t> publish_coordinator(caf::actor_system& sys, const coordinator_actor& whom,
                                     uint16_t port, const std::string& host) {
  auto published = tls_enabled(sys) ? caf::openssl::publish(whom, port, host.c_str(), true)
                                    : sys.middleman().publish(whom, port, host.c_str(), true);
  if (!published)
    return make_error(errc::backend_failure, "cannot listen on " + host + ":" + std::to_string(port)
                                               + ": " + sys.render(published.error()));
  return *published;
}

caf::actor node_connector(caf::actor_system& sys) {
  return caf::actor_cast<caf::actor>(tls_enabled(sys) ? sys.openssl_manager().actor_handle()
                                                      : sys.middleman().actor_handle());
}

result<coordinator_actor> connect_coordinator(caf::actor_system& sys, const host_port& where) {
  auto found = tls_enabled(sys)
                 ? caf::openssl::remote_actor<coordinator_actor>(sys, where.host, where.port)
                 : sys.middleman().remote_actor<coordinator_actor>(where.host, where.port);
  if (!found)
    return make_error(errc::engine_unavailable, "cannot reach the coordinator at " + where.host
                                                  + ":" + std::to_string(where.port) + ": "
                                                  + sys.render(found.error()));
  return *found;
}

} // namespace stitch::node
