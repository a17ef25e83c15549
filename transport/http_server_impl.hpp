#pragma once

// The HTTP server's insides, shared by its two files: `http_server.cpp`
// (listening, accepting, connection limits, stopping) and `http_session.cpp`
// (one connection: reading requests, pipelining, writing answers and event
// streams). Included by nothing else.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/strand.hpp>

#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/http_server.hpp"

namespace stitch::transport {

namespace net = boost::asio;
using tcp = net::ip::tcp;

/// What the server holds of an open connection (`http_session.cpp`).
class connection {
public:
  virtual ~connection() = default;
  /// Starts reading requests.
  virtual void start() = 0;
  /// Graceful drain: no more requests; close once the answers are written.
  virtual void drain() = 0;
  virtual void force_close() = 0;
};

struct http_server::impl : std::enable_shared_from_this<http_server::impl> {
  impl(http_server_options o, http_handler h)
      : opts(o), handler(std::move(h)), work(net::make_work_guard(ioc)), acceptor(ioc) {}

  /// Numbers the connections (`http_responder::connection`).
  std::atomic<uint64_t> connections_accepted{0};

  void accept();
  void session_closed(const std::string& client) {
    std::lock_guard guard{mutex};
    --connections;
    if (auto it = per_client.find(client); it != per_client.end() && --it->second == 0)
      per_client.erase(it);
    drained.notify_all();
  }
  /// Answers a connection over a limit with a 503 naming it, and closes it.
  static void refuse(tcp::socket& socket, std::string_view why) {
    auto e = make_http_error(http_failure::unavailable, std::string{why});
    std::string body = e.body();
    std::string head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                       "Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                       + std::to_string(body.size()) + "\r\n\r\n";
    boost::system::error_code ec;
    socket.non_blocking(true, ec);
    std::array<net::const_buffer, 2> parts{net::buffer(head), net::buffer(body)};
    socket.write_some(parts, ec);
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }

  http_server_options opts;
  /// With `opts.tls_cert`: the server's TLS context (made by `listen`).
  std::optional<net::ssl::context> tls;
  http_handler handler;
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  std::atomic<uint16_t> port{0};
  std::mutex mutex;
  std::condition_variable drained;
  size_t connections = 0;
  /// Open connections by client address.
  std::map<std::string, size_t> per_client;
  uint64_t refused_max = 0;
  uint64_t refused_client = 0;
  uint64_t refused_budget = 0;
  /// Bytes announced by the bodies being received (`body_budget`).
  uint64_t bodies_receiving = 0;
  std::vector<std::weak_ptr<connection>> sessions;

  /// Counts `n` announced body bytes against `body_budget`; false (and
  /// counted as refused) when they would pass it.
  bool reserve_body(uint64_t n) {
    std::lock_guard guard{mutex};
    // One body alone always fits (up to `body_limit`, which the parser
    // checked): a budget below the body limit never refuses a lone body.
    if (opts.body_budget && bodies_receiving > 0
        && (n > opts.body_budget || bodies_receiving > opts.body_budget - n)) {
      ++refused_budget;
      return false;
    }
    bodies_receiving += n;
    return true;
  }
  void release_body(uint64_t n) {
    std::lock_guard guard{mutex};
    bodies_receiving -= n;
  }
  bool stopped = false;
};

/// A connection accepted on `socket` (counted in `server` already).
std::shared_ptr<connection> make_session(tcp::socket socket,
                                         std::shared_ptr<http_server::impl> server);

} // namespace stitch::transport
