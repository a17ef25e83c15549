#pragma once

#include <string>
#include <string_view>

namespace stitch::transport {

/// The member capability derived from the admin token (DESIGN §5, docs
/// security.md): HMAC-SHA256 of a fixed label keyed by the token, in hex.
/// Cluster members present it on membership messages (join, enroll, offer,
/// placement, retire); it cannot be turned back into the admin token, so a
/// node given only it (`cluster.member_token`) takes part in the cluster but
/// cannot publish, move pointers or delete versions. An empty token derives
/// the empty capability (a cluster without a token admits everyone).
std::string member_capability(std::string_view admin_token);

} // namespace stitch::transport
