#pragma once

#include <string>
#include <vector>

#include "node/cli.hpp"

namespace stitch::node {

/// `stitch-node --check-security`: for the effective configuration, every
/// listener and outbound link of the node — its address, whether callers
/// are authenticated and traffic encrypted, and what a caller can do — then
/// the warnings (a token sent in plain HTTP off loopback, memory UCX lends
/// without write protection) and whether the node would refuse to start.
std::string security_report(const node_settings& s);

/// The warnings of `security_report` alone (the node logs them at start).
std::vector<std::string> security_warnings(const node_settings& s);

/// Why the node refuses to start as configured (a plain CAF listener on an
/// address other machines reach without `cluster.insecure`), or empty.
std::string security_refusal(const node_settings& s);

} // namespace stitch::node
