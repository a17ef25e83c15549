#pragma once

#include "runtime/core/http_errors.hpp"
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "transport/http_client.hpp"

namespace stitch::transport {

/// A request as the server read it.
struct server_request {
  std::string method;
  /// The target as sent: path and query.
  std::string target;
  /// The target without its query.
  std::string path;
  http_headers headers;
  std::string body;
  /// With `http_server_options::raw_large_bodies`: a body of known length of
  /// at least 1 MiB, read into this buffer as it arrives (neither zero-filled
  /// nor copied); `body` is then empty. Shared, so a handler may hand it on.
  std::shared_ptr<const char[]> raw_body;
  size_t raw_body_size = 0;
  /// The peer's address, for logs.
  std::string remote;

  /// The first header named `name` (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const { return find_header(headers, name); }
};

struct server_response {
  unsigned status = 200;
  std::string content_type = "application/json";
  http_headers headers;
  std::string body;
};

/// The answer to one request. Thread-safe: an actor answers from its own
/// thread and the write happens on the connection's strand. Only the first
/// answer counts.
class http_responder {
public:
  virtual ~http_responder() = default;
  /// Answers with a whole response.
  virtual void send(server_response response) = 0;
  /// Starts a server-sent-events answer (200, `text/event-stream`, chunked).
  virtual void start_events(http_headers headers) = 0;
  /// One event: `data: <data>\n\n`.
  virtual void event(std::string data) = 0;
  /// Ends the events (after a last `data: [DONE]` when `done_marker`).
  virtual void end_events(bool done_marker) = 0;
  /// `f` runs once if the client goes away before the answer is complete
  /// (on the server's thread; keep it short).
  virtual void on_disconnect(std::function<void()> f) = 0;
  /// `f` runs once if the client closes the connection this request came on
  /// (or the connection fails under a read or write), at whatever moment,
  /// answered or not; not when the server closes it itself (its idle, read
  /// or write timeout, `Connection: close`, `stop`). One per connection: a
  /// later call from any request on it replaces the earlier `f`. Runs at
  /// once if the client closed it already. For state a client keeps across
  /// its requests (a publish session bound to its connection).
  virtual void on_client_close(std::function<void()> f) = 0;
  /// The connection this request came on, unique among the server's.
  virtual uint64_t connection() const = 0;
};

/// Called on a server thread for every request; must not block: hand the
/// request on and answer through the responder later.
using http_handler = std::function<void(server_request, std::shared_ptr<http_responder>)>;

struct http_server_options {
  /// HTTPS: the server's certificate chain and private key (PEM files, the
  /// node's `[tls]` ones); empty: plain HTTP. A client gets `handshake
  /// time` of `idle_timeout` to finish its TLS handshake.
  std::string tls_cert;
  std::string tls_key;
  /// Larger request bodies are answered 413.
  size_t body_limit = size_t{16} << 20;
  /// Bytes of request bodies this server receives at once at most, counted
  /// by what their `Content-Length`s announce (`http.body_budget`); a body
  /// that would pass it is answered 503 (Retry-After) before any of it is
  /// read; a body received alone is always taken (up to `body_limit`).
  /// 0 = no limit. Memory follows the bytes that really arrived (a
  /// body grows as they do), so announcing without sending costs little.
  uint64_t body_budget = uint64_t{256} << 20;
  /// Larger request headers are answered 431.
  uint32_t header_limit = 16 * 1024;
  /// A connection waiting for (the header of) its next request this long is closed.
  std::chrono::milliseconds idle_timeout{60'000};
  /// Receiving a request body may take this long.
  std::chrono::milliseconds read_timeout{30'000};
  /// Each write of an answer may take this long.
  std::chrono::milliseconds write_timeout{30'000};
  /// Requests read ahead on one connection while earlier ones are unanswered.
  size_t max_pipeline = 16;
  /// Large bodies of known length arrive in `server_request::raw_body`
  /// (for handlers that take bulk bytes and know to look there).
  bool raw_large_bodies = false;
  /// Threads running the connections.
  size_t threads = 1;
  /// Runs first on each of those threads (empty: nothing). A surface that
  /// moves bulk bytes (the publisher's) lowers their scheduling priority
  /// here, so that its transfers never delay a node's request threads.
  std::function<void()> thread_setup;
  /// `stop` waits this long for answers in flight.
  std::chrono::milliseconds drain_timeout{30'000};
  /// Open connections at most (`http.max_connections`); one more is
  /// answered 503 and closed. 0 = no limit.
  size_t max_connections = 8192;
  /// Open connections from one client address at most
  /// (`http.max_connections_per_client`); 0 = no limit.
  size_t max_connections_per_client = 1024;
  /// Called (on a server thread; keep it short) with the head (no body) of
  /// a request whose header arrived but whose body did not: the client went
  /// away or stalled past `read_timeout` mid-body. The handler never sees
  /// such a request; one that keeps state across requests (a publish
  /// session) learns here that its client is gone.
  std::function<void(const server_request& head)> abandoned;
};

/// What a server has refused and holds (for `/metrics`).
struct http_server_stats {
  size_t open_connections = 0;
  /// Connections answered 503 because `max_connections` were open.
  uint64_t refused_max_connections = 0;
  /// ... because their client had `max_connections_per_client` open.
  uint64_t refused_per_client = 0;
  /// Requests answered 503 because their body would pass `body_budget`.
  uint64_t refused_body_budget = 0;
  /// Bytes announced by the bodies being received now.
  uint64_t bodies_receiving = 0;
};

/// An HTTP/1.1 server (Boost.Beast): keep-alive, a bounded pipeline per
/// connection answered in order, body and header limits, timeouts, and a
/// graceful drain. Malformed requests get a JSON 4xx naming the problem, then
/// the connection closes.
class http_server {
public:
  http_server(http_server_options options, http_handler handler);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds and starts serving; port 0 picks a free port. Returns the port.
  result<uint16_t> listen(const std::string& host, uint16_t port);
  /// Stops accepting, lets answers in flight finish (up to `drain_timeout`),
  /// then closes every connection. Idempotent.
  void stop();
  uint16_t port() const noexcept;
  size_t open_connections() const noexcept;
  http_server_stats stats() const;

  struct impl;

private:
  std::shared_ptr<impl> impl_;
};

/// The answer for an error: its status, the DESIGN §5 body and
/// `Retry-After` (the one mapping of `runtime/core/http_errors`).
server_response response_of(const http_error& e);
/// `response_of(make_http_error(why, message))`.
server_response error_response(http_failure why, std::string message);

class buffer_pool;
/// Where `raw_large_bodies` are read (bodies up to 64 MiB, and 64 MiB of
/// them kept warm between requests); shared by every server of the process.
buffer_pool& large_body_pool();

} // namespace stitch::transport
