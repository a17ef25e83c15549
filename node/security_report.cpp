#include "node/security_report.hpp"

#include <vector>

namespace stitch::node {

namespace {

bool tls_on(const node_settings& s) {
  return !s.tls_cert.empty();
}

std::string show(const config::listen_address& a) {
  return (a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host) + ":"
         + (a.port == 0 ? std::string{"(any free port)"} : std::to_string(a.port));
}

/// The node's CAF listener: the coordinator's port on the hub's node, the
/// mesh port on every other.
const config::listen_address& caf_listener(const node_settings& s, const char** key) {
  bool hub = s.has_role("coordinator");
  *key = hub ? "coordinator.listen" : "cluster.listen";
  return hub ? s.coordinator_listen : s.cluster_listen;
}

struct surface {
  std::string name;
  std::string address;
  std::string carries;
  bool https = false;
  /// Its listener's host, for the off-loopback warning.
  std::string host;
};

/// The host of `publisher.listen` (checked to be HOST:PORT by the config).
std::string publisher_host(const node_settings& s) {
  auto at = config::parse_listen_address(s.publisher_listen);
  return at ? at->host : std::string{};
}

/// The node's HTTP surfaces, with what they carry.
std::vector<surface> http_surfaces(const node_settings& s) {
  std::vector<surface> out;
  const bool admin = !s.admin_token.empty();
  if (s.has_role("gateway"))
    out.push_back({"gateway.listen", show(s.gateway_listen),
                   std::string{"rollout requests (open to every caller); POST /wake "}
                     + (admin ? "needs the admin token (Bearer)" : "open (no admin.token)"),
                   false, s.gateway_listen.host});
  if (s.has_role("status"))
    out.push_back({"status.listen", show(s.status_listen), "read-only status and metrics", false,
                   s.status_listen.host});
  if (s.has_role("publisher") && !s.publisher_listen.empty())
    out.push_back({"publisher.listen", s.publisher_listen,
                   admin ? "publishing weights, with the admin token as a Bearer header"
                         : "publishing weights, open to every caller (no admin.token)",
                   s.publisher_tls, publisher_host(s)});
  if (s.has_role("replica") && s.replicas > 0)
    out.push_back({"replica.listen", show(s.replica_listen) + " (+ i per replica)",
                   std::string{"inference and the engine's read-only routes; POST /wake "}
                     + (admin ? "needs the admin token" : "open"),
                   false, s.replica_listen.host});
  return out;
}

} // namespace

std::string security_refusal(const node_settings& s) {
  const char* key = nullptr;
  const auto& at = caf_listener(s, &key);
  if (tls_on(s) || s.cluster_insecure || is_loopback(at.host))
    return {};
  return std::string{key} + " = \"" + at.host
         + "\" is reachable from other machines, and without TLS anyone who reaches it speaks "
           "the nodes' messages: set [tls] cert, key and ca on every node (mutual TLS), keep it "
           "on 127.0.0.1, or set cluster.insecure = true on a network only the cluster reaches";
}

std::vector<std::string> security_warnings(const node_settings& s) {
  std::vector<std::string> out;
  const bool admin = !s.admin_token.empty();
  const char* key = nullptr;
  const auto& at = caf_listener(s, &key);
  if (!tls_on(s) && s.cluster_insecure && !is_loopback(at.host))
    out.push_back("cluster.insecure: the CAF listener " + std::string{key} + " (" + at.host
                  + ") is plain TCP, unauthenticated and unencrypted, reachable from other "
                    "machines");
  for (const auto& h : http_surfaces(s))
    if (admin && !is_loopback(h.host) && !h.https && h.name != "status.listen")
      out.push_back("warning: " + h.name + " (" + h.address
                    + ") is plain HTTP off loopback: the admin token its callers send crosses the "
                      "network in the clear (put it behind a TLS proxy, or on loopback)");
  if (!s.member_token.empty() && !tls_on(s) && !s.has_role("coordinator"))
    if (auto hub = parse_host_port(s.coordinator_address); hub && !is_loopback(hub->host))
      out.push_back("warning: the node's tokens travel in plain CAF to coordinator.address "
                    + s.coordinator_address + " (no [tls])");
  return out;
}

std::string security_report(const node_settings& s) {
  std::string out = "node " + s.name + ", roles";
  for (const auto& r : s.roles)
    out += " " + r;
  out += "\n\n";
  const bool tls = tls_on(s);
  const bool admin = !s.admin_token.empty();
  const bool member = !s.member_token.empty();
  const char* key = nullptr;
  const auto& at = caf_listener(s, &key);
  std::string caf_auth =
    tls                    ? "mutual TLS: only peers with a certificate tls.ca signed connect, and "
                             "the traffic is encrypted"
    : is_loopback(at.host) ? "plain TCP on loopback: only this machine connects; "
                             "unauthenticated, unencrypted"
    : s.cluster_insecure   ? "plain TCP, cluster.insecure: anyone who reaches it connects; "
                             "unauthenticated, unencrypted"
                           : "plain TCP on an address other machines reach: refused (no [tls], "
                             "no cluster.insecure)";
  out += "listener " + std::string{key} + " " + show(at) + " (CAF)\n  " + caf_auth + "\n";
  out += "  callers can: read (lookups, pointers, manifests, status: open inside the cluster); ";
  out += member ? "membership, placement and directory messages with the member token; "
                : "membership, placement and directory messages (no token: open); ";
  out += admin ? "store writes, pointer moves, retention and experiment changes with the admin "
                 "token\n"
               : "store writes, pointer moves, retention and experiment changes (no admin.token: "
                 "open)\n";
  if (!s.has_role("coordinator"))
    out += "outbound coordinator.address " + s.coordinator_address + " (CAF)\n  "
           + (tls ? std::string{"mutual TLS"} : std::string{"plain TCP"}) + "; presents "
           + (admin    ? "the admin token and the member token derived from it"
              : member ? "the member token only (cannot write the store)"
                       : "no token")
           + "\n";
  for (const auto& h : http_surfaces(s))
    out += "listener " + h.name + " " + h.address
           + (h.https ? " (HTTPS)\n  TLS with tls.cert (clients check it against tls.ca); "
                      : " (HTTP)\n  plain HTTP, unencrypted; ")
           + h.carries + "\n";
  if ((s.has_role("replica") || s.has_role("publisher"))
      && s.transfer_peers == config::peer_transfer::ucx)
    out += "listener UCX (every interface UCX_NET_DEVICES allows)\n  unencrypted; peers read "
           "lent weight memory with the remote keys of an offer, which needs the member token\n";
  out += "\n";
  if ((s.has_role("replica") || s.has_role("publisher"))
      && s.transfer_peers == config::peer_transfer::ucx)
    out += "note: on UCX's tcp and shared-memory transports (UCX 1.13) remote keys are not "
           "checked for write access: a member holding an offer could write lent memory, and "
           "receivers check every chunk against its digest\n";
  auto warnings = security_warnings(s);
  if (warnings.empty())
    out += "no warnings\n";
  for (const auto& w : warnings)
    out += w + "\n";
  auto refusal = security_refusal(s);
  out += refusal.empty() ? "the node starts with this configuration\n"
                         : "the node refuses to start: " + refusal + "\n";
  return out;
}

} // namespace stitch::node
