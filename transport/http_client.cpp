#include "transport/http_client.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <mutex>

namespace stitch::transport {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

bool has_line_break(std::string_view text) {
  return text.find_first_of("\r\n") != std::string_view::npos || text.find('\0') != text.npos;
}

/// Runs the asynchronous operation started by `start` to completion on `ioc`
/// and returns its error; the streams' own expiry turns a stall into
/// `beast::error::timeout`.
template <class Start>
beast::error_code run_to_completion(net::io_context& ioc, Start&& start) {
  beast::error_code result = net::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

} // namespace

std::string http_endpoint::host_header() const {
  const bool bracket = host.find(':') != std::string::npos;
  std::string out = bracket ? "[" + host + "]" : host;
  if (port != (tls() ? 443 : 80))
    out += ":" + std::to_string(port);
  return out;
}

std::string http_endpoint::to_string() const {
  const bool bracket = host.find(':') != std::string::npos;
  return scheme + "://" + (bracket ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

result<http_endpoint> parse_endpoint(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument,
                      "endpoint '" + std::string{url.substr(0, 200)} + "' " + std::string{why});
  };
  http_endpoint ep;
  std::string_view rest;
  if (url.starts_with("http://")) {
    ep.scheme = "http";
    ep.port = 80;
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    ep.scheme = "https";
    ep.port = 443;
    rest = url.substr(8);
  } else {
    return bad("must start with http:// or https://");
  }
  if (auto slash = rest.find('/'); slash != rest.npos) {
    if (rest.substr(slash) != "/")
      return bad("must not have a path");
    rest = rest.substr(0, slash);
  }
  if (rest.find_first_of("@?#") != rest.npos)
    return bad("must not have user info, a query or a fragment");
  std::string_view port_text;
  if (rest.starts_with("[")) {
    auto close = rest.find(']');
    if (close == rest.npos)
      return bad("has an unclosed '['");
    ep.host = std::string{rest.substr(1, close - 1)};
    auto after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':')
        return bad("has text after the IPv6 address");
      port_text = after.substr(1);
      if (port_text.empty())
        return bad("has an empty port");
    }
  } else {
    auto colon = rest.find(':');
    ep.host = std::string{rest.substr(0, colon)};
    if (colon != rest.npos) {
      port_text = rest.substr(colon + 1);
      if (port_text.empty())
        return bad("has an empty port");
    }
  }
  if (ep.host.empty())
    return bad("has no host");
  for (char c : ep.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'
          || c == ':'))
      return bad("has a host with the character '" + std::string(1, c) + "'");
  if (!port_text.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
    if (ec != std::errc{} || end != port_text.data() + port_text.size() || value == 0
        || value > 65535)
      return bad("has an invalid port");
    ep.port = static_cast<uint16_t>(value);
  }
  return ep;
}

const std::string* find_header(const http_headers& headers, std::string_view name) {
  for (const auto& h : headers)
    if (iequals(h.name, name))
      return &h.value;
  return nullptr;
}

struct http_client::impl {
  impl(http_endpoint e, http_client_options o) : ep(std::move(e)), opts(o) {}

  http_endpoint ep;
  http_client_options opts;
  std::mutex mutex;
  net::io_context ioc;
  std::optional<net::ssl::context> ssl_ctx;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  /// Requests completed on the current connection; >0 means it is a reused one.
  size_t served = 0;
  /// The last failure was a timeout (not worth repeating at once).
  bool timed_out_last = false;
  /// The current request's caller cancelled it.
  bool was_cancelled = false;

  stitch::error fail(std::string_view what, const beast::error_code& ec) {
    timed_out_last = ec == beast::error::timeout;
    std::string cause = ec == beast::error::timeout ? std::string{"timed out"} : ec.message();
    return make_error(errc::backend_failure,
                      ep.to_string() + ": " + std::string{what} + " failed: " + cause);
  }

  bool connected() const { return plain.has_value() || secure.has_value(); }

  beast::tcp_stream& lowest() { return plain ? *plain : beast::get_lowest_layer(*secure); }

  void disconnect() {
    if (connected()) {
      beast::error_code ignored;
      lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
      lowest().socket().close(ignored);
    }
    secure.reset();
    plain.reset();
    buffer.clear();
    served = 0;
  }

  /// A kept-alive connection the server has closed (or written to unasked)
  /// shows readable bytes or EOF; such a connection is dropped before use.
  bool connection_is_stale() {
    // One syscall: a byte waiting (nothing was asked) or the peer's close
    // makes the connection unusable; only "nothing to read" keeps it.
    char probe = 0;
    ssize_t n = ::recv(lowest().socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }

  result<bool> connect() {
    tcp::resolver resolver{ioc};
    net::steady_timer timer{ioc};
    tcp::resolver::results_type endpoints;
    beast::error_code resolve_ec = net::error::would_block;
    resolver.async_resolve(ep.host, std::to_string(ep.port),
                           [&](beast::error_code ec, tcp::resolver::results_type found) {
                             resolve_ec = ec;
                             endpoints = std::move(found);
                             timer.cancel();
                           });
    timer.expires_after(opts.connect_timeout);
    bool timed_out = false;
    timer.async_wait([&](beast::error_code ec) {
      if (!ec) {
        timed_out = true;
        resolver.cancel();
      }
    });
    ioc.restart();
    ioc.run();
    if (timed_out)
      return fail("resolving " + ep.host, beast::error::timeout);
    if (resolve_ec)
      return fail("resolving " + ep.host, resolve_ec);

    if (ep.tls()) {
      if (!ssl_ctx) {
        ssl_ctx.emplace(net::ssl::context::tls_client);
        beast::error_code ec;
        if (opts.ca_file.empty())
          ssl_ctx->set_default_verify_paths(ec);
        else
          ssl_ctx->load_verify_file(opts.ca_file, ec);
        if (ec)
          return fail(opts.ca_file.empty() ? "loading the system's CA certificates"
                                           : "loading the CA certificate " + opts.ca_file,
                      ec);
        ssl_ctx->set_verify_mode(opts.verify_tls ? net::ssl::verify_peer : net::ssl::verify_none,
                                 ec);
        if (ec)
          return fail("configuring TLS", ec);
      }
      secure.emplace(ioc, *ssl_ctx);
      if (!SSL_set_tlsext_host_name(secure->native_handle(), ep.host.c_str()))
        return make_error(errc::backend_failure,
                          ep.to_string() + ": setting the TLS server name failed");
      if (opts.verify_tls)
        secure->set_verify_callback(net::ssl::host_name_verification(ep.host));
    } else {
      plain.emplace(ioc);
    }
    lowest().expires_after(opts.connect_timeout);
    auto ec = run_to_completion(
      ioc, [&](auto handler) { lowest().async_connect(endpoints, std::move(handler)); });
    if (ec) {
      disconnect();
      return fail("connecting", ec);
    }
    // Header and body go out in separate writes: without this, Nagle's
    // algorithm and the peer's delayed ACK stall every request ~40 ms.
    boost::system::error_code nodelay;
    lowest().socket().set_option(net::ip::tcp::no_delay(true), nodelay);
    if (secure) {
      lowest().expires_after(opts.connect_timeout);
      ec = run_to_completion(ioc, [&](auto handler) {
        secure->async_handshake(net::ssl::stream_base::client, std::move(handler));
      });
      if (ec) {
        disconnect();
        return fail("TLS handshake", ec);
      }
    }
    return true;
  }

  /// Runs the operation `start` begins; with `cancelled`, polls it every
  /// 50 ms and closes the connection once it says so (the operation then
  /// ends with `operation_aborted` and `was_cancelled` is set).
  template <class Start>
  beast::error_code wait(Start&& start, const std::function<bool()>& cancelled) {
    if (!cancelled)
      return run_to_completion(ioc, std::forward<Start>(start));
    beast::error_code result = net::error::would_block;
    bool done = false;
    start([&](beast::error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    ioc.restart();
    while (!done) {
      ioc.run_for(std::chrono::milliseconds{50});
      if (!done && !was_cancelled && cancelled()) {
        was_cancelled = true;
        beast::error_code ignored;
        lowest().socket().cancel(ignored);
        lowest().socket().close(ignored);
      }
      if (!done && ioc.stopped())
        ioc.restart();
    }
    return result;
  }

  stitch::error read_failed(const http_request& request, const beast::error_code& ec) {
    if (was_cancelled)
      return make_error(errc::engine_unavailable, ep.to_string() + ": " + request.method + " "
                                                    + request.target
                                                    + " was cancelled (the caller went away)");
    return fail("reading the response to " + request.method + " " + request.target, ec);
  }

  /// Reads the response, handing its body to `request.on_body` piece by piece.
  template <class Stream>
  result<http_response> read_pieces(Stream& stream, const http_request& request,
                                    std::chrono::milliseconds io_limit, bool* got_response) {
    http::response_parser<http::buffer_body> parser;
    parser.header_limit(64 << 10);
    parser.body_limit(boost::none);
    if (request.method == "HEAD")
      parser.skip(true);
    lowest().expires_after(io_limit);
    auto ec = wait(
      [&](auto handler) { http::async_read_header(stream, buffer, parser, std::move(handler)); },
      request.cancelled);
    *got_response = parser.got_some();
    if (ec)
      return read_failed(request, ec);
    http_response out;
    out.status = parser.get().result_int();
    for (const auto& field : parser.get())
      out.headers.push_back({std::string{field.name_string()}, std::string{field.value()}});
    std::vector<char> piece(64 << 10);
    while (!parser.is_done()) {
      parser.get().body().data = piece.data();
      parser.get().body().size = piece.size();
      lowest().expires_after(io_limit);
      ec = wait(
        [&](auto handler) { http::async_read_some(stream, buffer, parser, std::move(handler)); },
        request.cancelled);
      if (ec == http::error::need_buffer)
        ec = {};
      if (ec)
        return read_failed(request, ec);
      size_t n = piece.size() - parser.get().body().size;
      if (n > 0)
        if (auto ok = request.on_body(out, std::string_view{piece.data(), n}); !ok) {
          disconnect();
          return std::move(ok).error();
        }
    }
    if (!parser.get().keep_alive())
      disconnect();
    else
      ++served;
    return out;
  }

  /// Blocks SIGPIPE on this thread while it lives (`sendfile` has no
  /// `MSG_NOSIGNAL`: a server that closed the connection would otherwise kill
  /// the process) and takes back one it raised.
  struct sigpipe_blocked {
    sigset_t pipe;
    sigset_t old;
    bool pending_before = false;
    sigpipe_blocked() {
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, &old);
      sigset_t pending;
      sigpending(&pending);
      pending_before = sigismember(&pending, SIGPIPE) == 1;
    }
    ~sigpipe_blocked() {
      sigset_t pending;
      sigpending(&pending);
      if (!pending_before && sigismember(&pending, SIGPIPE) == 1) {
        timespec now{0, 0};
        sigtimedwait(&pipe, nullptr, &now);
      }
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    sigpipe_blocked(const sigpipe_blocked&) = delete;
    sigpipe_blocked& operator=(const sigpipe_blocked&) = delete;
  };

  /// Sends `request.file_body` on the plain connection with `sendfile`,
  /// waiting up to `io_limit` each time the socket's buffer is full.
  status send_files(const http_request& request, std::chrono::milliseconds io_limit) {
    auto& socket = lowest().socket();
    beast::error_code ec;
    socket.native_non_blocking(true, ec);
    if (ec)
      return fail("sending " + request.method + " " + request.target, ec);
    const int fd = socket.native_handle();
    sigpipe_blocked quiet;
    for (const auto& r : request.file_body) {
      auto at = static_cast<off_t>(r.offset);
      uint64_t left = r.size;
      while (left > 0) {
        // 64 KiB at a time: on loopback one call also runs the receiver's
        // side of the transfer in this thread's system call, kernel time in
        // which a kernel without in-kernel preemption runs nothing else on
        // this core (the server reads 64 KiB at a time too, http_server.cpp).
        ssize_t n =
          ::sendfile(fd, r.fd, &at, static_cast<size_t>(std::min<uint64_t>(left, 64 << 10)));
        if (n > 0) {
          left -= static_cast<uint64_t>(n);
          continue;
        }
        if (n == 0)
          return make_error(errc::invalid_format,
                            ep.to_string() + ": the body of " + request.method + " "
                              + request.target + " is cut off: its file ends at byte "
                              + std::to_string(at) + ", before the " + std::to_string(r.size)
                              + " bytes from " + std::to_string(r.offset) + " it should send");
        if (errno == EINTR)
          continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          return fail("sending " + request.method + " " + request.target,
                      beast::error_code{errno, beast::system_category()});
        pollfd writable{fd, POLLOUT, 0};
        int ready = ::poll(&writable, 1, static_cast<int>(io_limit.count()));
        if (ready == 0)
          return fail("sending " + request.method + " " + request.target, beast::error::timeout);
        if (ready < 0 && errno != EINTR)
          return fail("sending " + request.method + " " + request.target,
                      beast::error_code{errno, beast::system_category()});
      }
    }
    return {};
  }

  /// One attempt on the current connection. `*got_response` tells whether any
  /// response byte arrived (then the request must not be replayed).
  template <class Stream>
  result<http_response> exchange(Stream& stream, const http_request& request, bool* got_response) {
    *got_response = false;
    const auto io_limit = request.io_timeout.count() > 0 ? request.io_timeout : opts.io_timeout;
    const bool from_files = !request.producer && !request.file_body.empty();
    const bool streamed = static_cast<bool>(request.producer) || from_files;
    uint64_t total = request.producer ? request.producer_size : request.body.size();
    if (from_files) {
      total = 0;
      for (const auto& r : request.file_body)
        total += r.size;
    }
    if (from_files && secure)
      return make_error(errc::invalid_argument,
                        ep.to_string() + ": a body of file ranges goes over plain HTTP only");
    const body_producer& produce = request.producer;

    http::request<http::buffer_body> req;
    req.method_string(request.method);
    req.target(request.target);
    req.version(11);
    req.set(http::field::host, ep.host_header());
    for (const auto& h : request.headers)
      req.insert(h.name, h.value);
    if (total > 0 || request.method == "PUT" || request.method == "POST")
      req.content_length(total);
    req.keep_alive(true);
    req.body().data = nullptr;
    req.body().more = total > 0;

    http::request_serializer<http::buffer_body> serializer{req};
    // Writes what the serializer has (a streamed body: up to its next piece).
    auto write_out = [&] {
      lowest().expires_after(io_limit);
      auto e = run_to_completion(
        ioc, [&](auto handler) { http::async_write(stream, serializer, std::move(handler)); });
      return e == http::error::need_buffer ? beast::error_code{} : e;
    };
    beast::error_code ec;
    if (!streamed) {
      // Header and body in one write (one segment for a small request).
      req.body().data = total > 0 ? const_cast<char*>(request.body.data()) : nullptr;
      req.body().size = total;
      req.body().more = false;
      ec = write_out();
      if (ec)
        return fail("sending " + request.method + " " + request.target, ec);
    } else {
      lowest().expires_after(io_limit);
      ec = run_to_completion(ioc, [&](auto handler) {
        http::async_write_header(stream, serializer, std::move(handler));
      });
      if (ec)
        return fail("sending " + request.method + " " + request.target, ec);
    }

    if (from_files && !secure) {
      if (auto ok = send_files(request, io_limit); !ok) {
        disconnect();
        return std::move(ok).error();
      }
    }
    std::vector<std::byte> chunk;
    uint64_t sent = 0;
    while (produce && !serializer.is_done()) {
      if (sent == total) {
        req.body().data = nullptr;
        req.body().more = false;
      } else {
        chunk.resize(std::min<uint64_t>(total, 256 << 10));
        auto want = std::min<uint64_t>(chunk.size(), total - sent);
        auto n = produce(std::span{chunk}.first(want));
        if (!n) {
          disconnect();
          return std::move(n).error();
        }
        if (*n == 0 || *n > want) {
          disconnect();
          return make_error(errc::invalid_argument, ep.to_string() + ": the body of "
                                                      + request.method + " " + request.target
                                                      + " ended after " + std::to_string(sent)
                                                      + " of " + std::to_string(total) + " bytes");
        }
        req.body().data = chunk.data();
        req.body().size = *n;
        sent += *n;
        req.body().more = sent < total;
      }
      ec = write_out();
      if (ec)
        return fail("sending " + request.method + " " + request.target, ec);
    }

    if (request.on_body)
      return read_pieces(stream, request, io_limit, got_response);
    const size_t limit = request.body_limit ? request.body_limit : opts.max_body_bytes;
    http::response_parser<http::string_body> parser;
    parser.header_limit(64 << 10);
    parser.body_limit(limit);
    if (request.method == "HEAD")
      parser.skip(true);
    // The header alone first: Beast 1.74's eager parse of a header and body
    // arriving together skips the Content-Length check against the limit.
    lowest().expires_after(io_limit);
    ec = wait(
      [&](auto handler) { http::async_read_header(stream, buffer, parser, std::move(handler)); },
      request.cancelled);
    if (!ec && !parser.is_done()) {
      lowest().expires_after(io_limit);
      ec = wait([&](auto handler) { http::async_read(stream, buffer, parser, std::move(handler)); },
                request.cancelled);
    }
    *got_response = parser.got_some();
    if (!ec && parser.get().body().size() > limit)
      ec = http::error::body_limit;
    if (ec == http::error::body_limit) {
      disconnect();
      return make_error(errc::limit_exceeded, ep.to_string() + ": the response to " + request.method
                                                + " " + request.target + " is larger than "
                                                + std::to_string(limit) + " bytes");
    }
    if (ec)
      return read_failed(request, ec);
    auto message = parser.release();
    http_response out;
    out.status = message.result_int();
    for (const auto& field : message)
      out.headers.push_back({std::string{field.name_string()}, std::string{field.value()}});
    out.body = std::move(message.body());
    if (!message.keep_alive())
      disconnect();
    else
      ++served;
    return out;
  }

  result<http_response> attempt(const http_request& request, bool* reused, bool* got_response) {
    *got_response = false;
    timed_out_last = false;
    was_cancelled = false;
    if (connected() && connection_is_stale())
      disconnect();
    *reused = connected();
    if (!connected())
      if (auto ok = connect(); !ok)
        return std::move(ok).error();
    auto out =
      secure ? exchange(*secure, request, got_response) : exchange(*plain, request, got_response);
    if (!out)
      disconnect();
    return out;
  }

  result<http_response> send(const http_request& request) {
    if (has_line_break(request.method) || has_line_break(request.target) || request.method.empty()
        || request.target.empty())
      return make_error(errc::invalid_argument, "HTTP request line with a line break or empty");
    for (const auto& h : request.headers)
      if (h.name.empty() || has_line_break(h.name) || has_line_break(h.value)
          || h.name.find(':') != std::string::npos)
        return make_error(errc::invalid_argument,
                          "HTTP header '" + h.name.substr(0, 64) + "' is malformed");
    bool reused = false;
    bool got_response = false;
    auto out = attempt(request, &reused, &got_response);
    // A kept-alive connection can die between the stale check and the write;
    // that is not the server refusing the request, so it is tried once more.
    if (!out && out.error().code == errc::backend_failure && reused && !got_response
        && !request.producer && request.file_body.empty() && !timed_out_last && !was_cancelled)
      out = attempt(request, &reused, &got_response);
    return out;
  }
};

http_client::http_client(http_endpoint endpoint, http_client_options options)
    : impl_(std::make_unique<impl>(std::move(endpoint), options)) {}

http_client::~http_client() {
  impl_->disconnect();
}

const http_endpoint& http_client::endpoint() const noexcept {
  return impl_->ep;
}

result<http_response> http_client::send(const http_request& request) {
  std::lock_guard lock{impl_->mutex};
  try {
    return impl_->send(request);
  } catch (const std::exception& e) {
    impl_->disconnect();
    return make_error(errc::backend_failure, impl_->ep.to_string() + ": " + e.what());
  }
}

void http_client::close() {
  std::lock_guard lock{impl_->mutex};
  impl_->disconnect();
}

} // namespace stitch::transport
