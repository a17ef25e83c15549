#include "transport/http_server.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "transport/http_server_impl.hpp"

namespace stitch::transport {

server_response response_of(const http_error& e) {
  server_response r;
  r.status = e.status;
  r.body = e.body();
  if (e.retry_after > 0)
    r.headers.push_back({"Retry-After", std::to_string(e.retry_after)});
  return r;
}

server_response error_response(http_failure why, std::string message) {
  return response_of(make_http_error(why, std::move(message)));
}

void http_server::impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](
                                                 boost::system::error_code ec, tcp::socket socket) {
    if (self->stopping)
      return;
    if (!ec) {
      boost::system::error_code nd;
      socket.set_option(tcp::no_delay(true), nd);
      auto peer = socket.remote_endpoint(nd);
      const std::string client = nd ? std::string{} : peer.address().to_string();
      std::shared_ptr<connection> s;
      {
        std::lock_guard guard{self->mutex};
        const auto& o = self->opts;
        if (o.max_connections && self->connections >= o.max_connections) {
          ++self->refused_max;
          refuse(socket, "this server has its " + std::to_string(o.max_connections)
                           + " connections open (http.max_connections)");
          self->accept();
          return;
        }
        if (o.max_connections_per_client
            && self->per_client[client] >= o.max_connections_per_client) {
          ++self->refused_client;
          refuse(socket, "this client has " + std::to_string(o.max_connections_per_client)
                           + " connections open (http.max_connections_per_client)");
          self->accept();
          return;
        }
        ++self->connections;
        ++self->per_client[client];
        s = make_session(std::move(socket), self);
        std::erase_if(self->sessions, [](const auto& w) { return w.expired(); });
        self->sessions.push_back(s);
      }
      s->start();
    } else if (ec != net::error::operation_aborted) {
      // Out of descriptors (EMFILE) or the like: accepting again at once
      // would spin on the same error; connections wait in the backlog.
      auto pause = std::make_shared<net::steady_timer>(self->ioc, std::chrono::milliseconds{50});
      pause->async_wait([self, pause](boost::system::error_code) {
        if (!self->stopping)
          self->accept();
      });
      return;
    }
    self->accept();
  });
}

http_server::http_server(http_server_options options, http_handler handler)
    : impl_(std::make_shared<impl>(options, std::move(handler))) {}

http_server::~http_server() {
  stop();
}

result<uint16_t> http_server::listen(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  if (!impl_->opts.tls_cert.empty()) {
    auto& tls = impl_->tls.emplace(net::ssl::context::tls_server);
    tls.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2
                      | net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1
                      | net::ssl::context::no_tlsv1_1,
                    ec);
    if (!ec)
      tls.use_certificate_chain_file(impl_->opts.tls_cert, ec);
    if (!ec)
      tls.use_private_key_file(impl_->opts.tls_key, net::ssl::context::pem, ec);
    if (ec)
      return make_error(errc::invalid_argument,
                        "cannot serve HTTPS with " + quote_untrusted(impl_->opts.tls_cert) + " and "
                          + quote_untrusted(impl_->opts.tls_key) + ": " + ec.message());
  }
  auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec)
    return make_error(errc::invalid_argument,
                      "cannot listen on " + quote_untrusted(host) + ": not an IP address");
  tcp::endpoint ep{address, port};
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec)
    a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    a.bind(ep, ec);
  if (!ec)
    a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot listen on " + host + ":" + std::to_string(port)
                                               + ": " + ec.message());
  impl_->port = a.local_endpoint().port();
  impl_->accept();
  for (size_t i = 0; i < std::max<size_t>(1, impl_->opts.threads); ++i)
    impl_->threads.emplace_back([s = impl_] {
      if (s->opts.thread_setup)
        s->opts.thread_setup();
      s->ioc.run();
    });
  return impl_->port.load();
}

void http_server::stop() {
  auto& s = *impl_;
  std::vector<std::shared_ptr<connection>> live;
  {
    std::lock_guard guard{s.mutex};
    if (s.stopped)
      return;
    s.stopped = true;
    s.stopping = true;
    for (auto& w : s.sessions)
      if (auto p = w.lock())
        live.push_back(std::move(p));
  }
  net::post(s.ioc, [&s] {
    boost::system::error_code ec;
    s.acceptor.close(ec);
  });
  for (auto& p : live)
    p->drain();
  // Outside the lock: the last reference to a session closes it, and its
  // destructor takes the lock (`session_closed`).
  live.clear();
  {
    std::unique_lock lock{s.mutex};
    s.drained.wait_for(lock, s.opts.drain_timeout, [&] { return s.connections == 0; });
    for (auto& w : s.sessions)
      if (auto p = w.lock())
        live.push_back(std::move(p));
  }
  for (auto& p : live)
    p->force_close();
  live.clear();
  s.work.reset();
  if (s.threads.empty()) {
    s.ioc.stop();
  }
  for (auto& t : s.threads)
    t.join();
  s.threads.clear();
}

uint16_t http_server::port() const noexcept {
  return impl_->port.load();
}

size_t http_server::open_connections() const noexcept {
  std::lock_guard guard{impl_->mutex};
  return impl_->connections;
}

http_server_stats http_server::stats() const {
  std::lock_guard guard{impl_->mutex};
  return {impl_->connections, impl_->refused_max, impl_->refused_client, impl_->refused_budget,
          impl_->bodies_receiving};
}

} // namespace stitch::transport
