#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch::transport {

/// Where an HTTP client connects: `http://host[:port]` or `https://host[:port]`.
struct http_endpoint {
  /// "http" or "https".
  std::string scheme = "http";
  std::string host;
  uint16_t port = 80;

  bool tls() const noexcept { return scheme == "https"; }
  /// The `Host` header value: the port is left out when it is the scheme's default.
  std::string host_header() const;
  /// `scheme://host:port`, for messages.
  std::string to_string() const;

  friend bool operator==(const http_endpoint&, const http_endpoint&) = default;
};

/// Parses `http://host[:port][/]` or `https://...` (IPv6 hosts in brackets). A
/// path other than "/", a query, user info or an unknown scheme is an
/// `invalid_argument` error quoting the text.
result<http_endpoint> parse_endpoint(std::string_view url);

struct http_header {
  std::string name;
  std::string value;

  friend bool operator==(const http_header&, const http_header&) = default;
};
using http_headers = std::vector<http_header>;

/// The value of the first header named `name` (case-insensitive), or nullptr.
const std::string* find_header(const http_headers& headers, std::string_view name);

/// Fills up to `out.size()` bytes of a streamed request body and returns how
/// many; 0 before the declared size is reached is an error.
using body_producer = std::function<result<size_t>(std::span<std::byte> out)>;

/// `size` bytes of the open file `fd` from `offset`: a piece of a request
/// body sent straight from the file.
struct file_range {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct http_response {
  unsigned status = 0;
  http_headers headers;
  std::string body;
};

struct http_request {
  std::string method = "GET";
  /// The request target: an already percent-encoded path plus query.
  std::string target = "/";
  /// Extra headers; `Host`, `Content-Length` and `Connection` are set by the client.
  http_headers headers;
  /// The body when `producer` is empty. Not owned: it must outlive `send`.
  std::string_view body;
  /// A body streamed in pieces, exactly `producer_size` bytes. Such a body
  /// cannot be replayed, so a request using it is never retried.
  body_producer producer;
  uint64_t producer_size = 0;
  /// A body made of these file ranges, in order (when `producer` is empty),
  /// sent by the kernel from the page cache (`sendfile`: no copy through
  /// this process); plain HTTP only (over TLS it is an `invalid_argument`
  /// error). A file shorter than its range fails the request (the
  /// connection is closed, so the server sees a cut-off body). Never
  /// retried: the files may have changed.
  std::vector<file_range> file_body;
  /// Largest response body accepted for this request; 0 = the client's default.
  size_t body_limit = 0;
  /// With `on_body`, the response body is handed over in pieces as they
  /// arrive (a stream of server-sent events, say) instead of being collected
  /// in `http_response::body`, and no body limit applies. An error it returns
  /// ends the exchange and closes the connection.
  /// `head` is the response without its body (status and headers).
  std::function<status(const http_response& head, std::string_view piece)> on_body;
  /// Polled while the response is awaited (every 50 ms): once it returns
  /// true the connection is closed (the server sees the client leave) and
  /// `send` fails with `errc::engine_unavailable` saying it was cancelled.
  std::function<bool()> cancelled;
  /// Limit for each read or write of this request; 0 = the client's
  /// `io_timeout` (a long generation answers after one long wait).
  std::chrono::milliseconds io_timeout{0};
};

struct http_client_options {
  std::chrono::milliseconds connect_timeout{10'000};
  /// Limit for each read or write of a request or response (not the whole exchange).
  std::chrono::milliseconds io_timeout{60'000};
  /// Largest response body accepted; larger ones are refused (`limit_exceeded`).
  size_t max_body_bytes = size_t{80} << 20;
  /// Verify the server's certificate and host name over https.
  bool verify_tls = true;
  /// The CA (PEM file) that signed the server's certificate (a cluster's
  /// `tls.ca`); empty: the system's CA certificates.
  std::string ca_file = {};
};

/// A minimal synchronous HTTP/1.1 client for one endpoint, reusing one
/// keep-alive connection across requests (reconnecting when the server closed
/// it). Thread-safe through an internal mutex: concurrent callers are
/// serialized on the one connection, so a caller wanting parallel requests
/// holds several clients (as `s3_client` does with its pool).
///
/// Failures to connect, send or receive are `errc::backend_failure` errors
/// naming the endpoint and the cause; an oversized response is
/// `errc::limit_exceeded`. Any HTTP status is a successful `send`.
class http_client {
public:
  explicit http_client(http_endpoint endpoint, http_client_options options = {});
  ~http_client();
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  const http_endpoint& endpoint() const noexcept;

  /// Sends `request` and reads the whole response. A request that fails on a
  /// reused connection before any response byte arrived is retried once on a
  /// fresh connection when its body can be replayed.
  result<http_response> send(const http_request& request);

  /// Closes the connection (the next request opens a new one).
  void close();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace stitch::transport
