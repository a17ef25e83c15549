#include "node/remote.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/all.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

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

result<uint16_t> publish_mesh_anchor(caf::actor_system& sys, const caf::actor& anchor,
                                     uint16_t port, const std::string& host) {
  auto published = tls_enabled(sys) ? caf::openssl::publish(anchor, port, host.c_str(), true)
                                    : sys.middleman().publish(anchor, port, host.c_str(), true);
  if (!published)
    return make_error(errc::backend_failure, "cluster.listen: cannot listen on " + host + ":"
                                               + std::to_string(port) + ": "
                                               + sys.render(published.error()));
  return *published;
}

result<std::string> advertised_host(const std::string& bind_host, const std::string& toward_host) {
  if (!bind_host.empty() && bind_host != "0.0.0.0" && bind_host != "::")
    return bind_host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(toward_host.c_str(), "9", &hints, &found); rc != 0 || !found)
    return make_error(errc::invalid_argument, "cluster.listen: cannot resolve the coordinator's "
                                              "host "
                                                + toward_host
                                                + " to pick the address "
                                                  "other nodes reach this one at: "
                                                + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned{found, freeaddrinfo};
  int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  if (fd < 0)
    return make_error(errc::backend_failure, "cluster.listen: no socket to find this node's "
                                             "address");
  sockaddr_storage local{};
  socklen_t size = sizeof local;
  // A datagram socket's connect sends nothing: it only picks the route.
  bool ok = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0
            && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) == 0;
  ::close(fd);
  char text[INET6_ADDRSTRLEN] = {};
  const void* where =
    local.ss_family == AF_INET6
      ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
      : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  if (!ok || !inet_ntop(local.ss_family, where, text, sizeof text))
    return make_error(errc::backend_failure, "cluster.listen: no route to the coordinator's host "
                                               + toward_host
                                               + " to pick this node's address; name "
                                                 "one in cluster.listen");
  return std::string{text};
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
