#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "actors/publisher_actor.hpp"
#include "runtime/core/error.hpp"
#include "runtime/pipeline/tensor_stream.hpp"
#include "transport/http_client.hpp"

namespace stitch::node {

/// Bytes a streamed publish sends per `PUT` (at most what the surface takes,
/// its `max_request_bytes`): the node holds two of them of this client.
inline constexpr uint64_t http_publish_request_bytes = uint64_t{16} << 20;

/// Where `stitch publish --stream` sends its bytes over HTTP, given the URL
/// the publisher advertises (`publisher.listen` as configured): that host
/// when it names one; the host the CLI reached the coordinator at when the
/// surface listens on every address and the publisher runs on the
/// coordinator's node; a loopback host only when the coordinator too is on
/// loopback (this machine) and the publisher on its node. Otherwise (no
/// surface, another node behind a wildcard or loopback, a URL that does not
/// parse) nullopt: the bytes go through the cluster connection.
std::optional<transport::http_endpoint> http_surface_for(std::string_view advertised,
                                                         std::string_view coordinator_host,
                                                         bool on_coordinator_node);

/// How a publish over the publisher's HTTP surface ended.
struct http_publish_outcome {
  result<pipeline::publish_report> summary = make_error(errc::invalid_argument, "not published");
  /// The surface could not be reached at all (no answer to the opening
  /// request): nothing was opened, so the caller may send the bytes another
  /// way.
  bool unreachable = false;
};

/// `stitch publish --stream` over the publisher's HTTP surface at `at`
/// (DESIGN §5 "Publisher"): opens a session with the tensors of `source`,
/// sends their bytes in requests of `request_bytes` straight from the files
/// (`sendfile`: no copy through this process), then commits. Any failure
/// after the session opened deletes it (nothing becomes visible); a
/// connection lost mid-way is a retryable `engine_unavailable`. Error
/// answers keep their kind (`errc_of_http_answer`) and message.
http_publish_outcome publish_over_http(const transport::http_endpoint& at, const publish_args& args,
                                       const pipeline::directory_stream& source,
                                       uint64_t request_bytes = http_publish_request_bytes);

} // namespace stitch::node
