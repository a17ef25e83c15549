#include "transport/http_server_impl.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

#include "runtime/core/constraint.hpp"
#include "transport/buffer_pool.hpp"

namespace stitch::transport {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

buffer_pool& large_body_pool() {
  // Never destroyed: a body may be released while the process exits.
  static auto* pool = new buffer_pool{size_t{64} << 20, size_t{64} << 20};
  return *pool;
}

namespace {

/// Bodies of at least this many bytes (and a Content-Length) skip the parser.
constexpr uint64_t large_body = uint64_t{1} << 20;

// A large body is read with asio's `transfer_all`: into its whole buffer,
// 64 KiB per system call (asio's `default_max_transfer_size`). Larger reads
// cost fewer calls, but on loopback a read also runs the sender's transmit
// of the data behind it (softirq work in this thread's system call): reads
// of 256 KiB took 0.75 ms, kernel time in which a kernel built without
// in-kernel preemption (PREEMPT_NONE) runs nothing else on that core, and a
// node's request threads waited that long (bench/HISTORY.md, sixteenth pass).
// 64 KiB reads ended those waits and moved a streamed publish as fast.

class session;

/// What a connection's requests know of it, beyond the connection's own
/// life (a responder may outlive its connection). Strand-only, but `id`.
struct connection_state {
  explicit connection_state(uint64_t id) : id(id) {}
  const uint64_t id;
  bool closed = false;
  bool closed_by_client = false;
  std::function<void()> on_client_close;
};

/// One request's place in its connection's pipeline; the responder of it.
class slot final : public http_responder, public std::enable_shared_from_this<slot> {
public:
  slot(std::weak_ptr<session> owner, std::shared_ptr<connection_state> conn,
       net::strand<net::io_context::executor_type> strand, bool keep_alive, unsigned version)
      : owner_(std::move(owner)), conn_(std::move(conn)), strand_(std::move(strand)),
        keep_alive(keep_alive), version(version) {}

private:
  std::weak_ptr<session> owner_;
  std::shared_ptr<connection_state> conn_;
  net::strand<net::io_context::executor_type> strand_;

public:
  void send(server_response response) override;
  void start_events(http_headers headers) override;
  void event(std::string data) override;
  void end_events(bool done_marker) override;
  void on_disconnect(std::function<void()> f) override;
  void on_client_close(std::function<void()> f) override;
  uint64_t connection() const override { return conn_->id; }

  // Strand-only state.
  bool keep_alive;
  unsigned version;
  bool answered = false;
  std::optional<server_response> whole;
  bool events = false;
  http_headers event_headers;
  std::deque<std::string> chunks;
  bool ended = false;
  bool header_written = false;
  bool closed = false;
  std::function<void()> disconnect;
  std::optional<bhttp::response<bhttp::empty_body>> event_head;
  std::optional<bhttp::response_serializer<bhttp::empty_body>> event_serializer;

  /// The client went away: tell whoever waits for it, once.
  void gone() {
    if (closed)
      return;
    closed = true;
    if (disconnect && !(answered && (!events || ended)))
      std::exchange(disconnect, {})();
  }

private:
  template <class F>
  void on_strand(F f);
};

class session final : public connection, public std::enable_shared_from_this<session> {
public:
  session(tcp::socket socket, std::shared_ptr<http_server::impl> server)
      : strand_(net::make_strand(server->ioc)), stream_(plain_or_tls(std::move(socket), *server)),
        server_(server), conn_(std::make_shared<connection_state>(++server->connections_accepted)),
        read_timer_(strand_), write_timer_(strand_) {
    boost::system::error_code ec;
    auto ep = raw().remote_endpoint(ec);
    if (!ec) {
      client_ = ep.address().to_string();
      remote_ = client_ + ":" + std::to_string(ep.port());
    }
  }

  ~session() {
    release_body();
    server_->session_closed(client_);
  }

  net::strand<net::io_context::executor_type>& strand() { return strand_; }

  void start() override {
    net::dispatch(strand_, [self = shared_from_this()] {
      auto* tls = std::get_if<tls_stream>(&self->stream_);
      if (!tls)
        return self->read_next();
      // The handshake gets the idle time a request's header would.
      self->arm(self->read_timer_, self->server_->opts.idle_timeout);
      tls->async_handshake(net::ssl::stream_base::server,
                           net::bind_executor(self->strand_, [self](boost::system::error_code ec) {
                             self->read_timer_.cancel();
                             if (ec)
                               return self->close();
                             self->read_next();
                           }));
    });
  }

  /// Graceful drain: no more requests; close once the answers are written.
  void drain() override {
    net::dispatch(strand_, [self = shared_from_this()] {
      self->draining_ = true;
      if (self->slots_.empty())
        self->close();
    });
  }

  void force_close() override {
    net::dispatch(strand_, [self = shared_from_this()] { self->close(); });
  }

  /// Writes whatever the head of the pipeline has ready.
  void pump() {
    if (writing_ || conn_->closed || slots_.empty())
      return;
    auto head = slots_.front();
    if (!head->answered)
      return;
    if (head->whole) {
      write_whole(head);
    } else if (head->events) {
      write_events(head);
    }
  }

private:
  using tls_stream = net::ssl::stream<tcp::socket>;

  static std::variant<tcp::socket, tls_stream> plain_or_tls(tcp::socket socket,
                                                            http_server::impl& server) {
    using both = std::variant<tcp::socket, tls_stream>;
    if (server.tls)
      return both{std::in_place_type<tls_stream>, std::move(socket), *server.tls};
    return both{std::in_place_type<tcp::socket>, std::move(socket)};
  }

  /// The connection's socket, under TLS or not.
  tcp::socket& raw() {
    if (auto* tls = std::get_if<tls_stream>(&stream_))
      return tls->next_layer();
    return std::get<tcp::socket>(stream_);
  }

  /// Runs `op` with the stream the connection reads and writes.
  template <class Op>
  void with_stream(Op&& op) {
    std::visit([&](auto& s) { op(s); }, stream_);
  }

  void arm(net::steady_timer& timer, std::chrono::milliseconds after) {
    timer.expires_after(after);
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec)
        self->close();
    });
  }

  void read_next() {
    if (reading_ || conn_->closed || stop_reading_ || draining_
        || slots_.size() >= server_->opts.max_pipeline)
      return;
    reading_ = true;
    parser_.emplace();
    parser_->body_limit(server_->opts.body_limit);
    parser_->header_limit(server_->opts.header_limit);
    // Waiting for a next request while none is pending is idle time; while
    // answers are pending the client may legitimately stay silent.
    if (slots_.empty())
      arm(read_timer_, server_->opts.idle_timeout);
    with_stream([&](auto& s) {
      bhttp::async_read_header(
        s, buffer_, *parser_,
        net::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec,
                                                                size_t) { self->on_header(ec); }));
    });
  }

  void on_header(boost::system::error_code ec) {
    if (ec)
      return on_read_error(ec);
    have_header_ = true;
    arm(read_timer_, server_->opts.read_timeout);
    auto& req = parser_->get();
    auto expect = req[bhttp::field::expect];
    if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
      static const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      with_stream([&](auto& s) {
        net::async_write(s, net::buffer(cont),
                         net::bind_executor(strand_, [self = shared_from_this()](
                                                       boost::system::error_code wec, size_t) {
                           if (wec)
                             return self->on_read_error(wec);
                           self->read_body();
                         }));
      });
      return;
    }
    read_body();
  }

  /// The body being received no longer counts against the budget.
  void release_body() {
    if (auto n = std::exchange(reserved_, 0))
      server_->release_body(n);
  }

  void read_body() {
    if (auto n = parser_->content_length(); n && *n > 0 && !parser_->is_done()) {
      if (!server_->reserve_body(*n)) {
        reading_ = false;
        have_header_ = false;
        read_timer_.cancel();
        refuse(http_failure::unavailable,
               "a request body of " + std::to_string(*n)
                 + " bytes would pass the bytes this surface receives at once (http.body_budget = "
                 + std::to_string(server_->opts.body_budget) + "); try again");
        return;
      }
      reserved_ = *n;
    }
    // A large body of known length (tensor bytes of an HTTP publish) is read
    // straight into its string in one operation: Beast's parser would take
    // it 64 KiB per read, each through the strand (a fifth of the rate).
    if (auto n = parser_->content_length(); n && *n >= large_body && !parser_->chunked()
                                            && !parser_->is_done()
                                            && server_->opts.raw_large_bodies) {
      // Not even zero-filled first: every byte is about to be overwritten.
      // Recycled: a fresh allocation would fault in new pages every few
      // bodies (buffer_pool.hpp says why).
      const size_t size = static_cast<size_t>(*n);
      std::shared_ptr<char[]> raw = large_body_pool().take(size);
      if (!raw) {
        reading_ = false;
        read_timer_.cancel();
        refuse(http_failure::unavailable,
               "no memory for a request body of " + std::to_string(size) + " bytes");
        return;
      }
      size_t have = std::min(buffer_.size(), size);
      net::buffer_copy(net::buffer(raw.get(), have), buffer_.data());
      buffer_.consume(have);
      with_stream([&](auto& s) {
        net::async_read(s, net::buffer(raw.get() + have, size - have), net::transfer_all(),
                        net::bind_executor(strand_, [self = shared_from_this(), raw,
                                                     size](boost::system::error_code ec, size_t) {
                          if (!ec) {
                            self->raw_body_ = raw;
                            self->raw_body_size_ = size;
                          }
                          self->on_request(ec);
                        }));
      });
      return;
    }
    if (auto n = parser_->content_length();
        n && *n >= large_body && !parser_->chunked() && !parser_->is_done()) {
      const size_t want = static_cast<size_t>(*n);
      auto body = std::make_shared<std::string>();
      size_t have = std::min(buffer_.size(), want);
      body->resize(have);
      net::buffer_copy(net::buffer(body->data(), have), buffer_.data());
      buffer_.consume(have);
      read_growing(std::move(body), want);
      return;
    }
    with_stream([&](auto& s) {
      bhttp::async_read(
        s, buffer_, *parser_,
        net::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec,
                                                                size_t) { self->on_request(ec); }));
    });
  }

  /// Reads the rest of a body of `want` bytes into `body` (which holds what
  /// arrived so far), growing it as the bytes arrive: by what it holds, at
  /// least 64 KiB, so it is never more than twice what was received (a
  /// client that announces a large body and sends nothing costs 64 KiB).
  void read_growing(std::shared_ptr<std::string> body, size_t want) {
    const size_t have = body->size();
    if (have == want) {
      parser_->get().body() = std::move(*body);
      return on_request({});
    }
    const size_t step = std::min(want - have, std::max(have, size_t{64} << 10));
    body->resize(have + step);
    with_stream([&](auto& s) {
      net::async_read(s, net::buffer(body->data() + have, step), net::transfer_all(),
                      net::bind_executor(strand_, [self = shared_from_this(), body,
                                                   want](boost::system::error_code ec, size_t) {
                        if (ec)
                          return self->on_request(ec);
                        self->read_growing(body, want);
                      }));
    });
  }

  void on_read_error(boost::system::error_code ec) {
    release_body();
    reading_ = false;
    read_timer_.cancel();
    const bool mid_body = std::exchange(have_header_, false);
    std::optional<http_failure> why;
    std::string message;
    if (ec == bhttp::error::body_limit) {
      why = http_failure::payload_too_large;
      message = "the request body exceeds the limit of " + std::to_string(server_->opts.body_limit)
                + " bytes";
    } else if (ec == bhttp::error::header_limit) {
      why = http_failure::headers_too_large;
      message = "the request header exceeds the limit of "
                + std::to_string(server_->opts.header_limit) + " bytes";
    } else if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category()
               && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      why = http_failure::bad_request;
      message = "malformed HTTP request: " + ec.message();
    }
    if (!why && mid_body && server_->opts.abandoned) {
      // The client went away (or a timer closed the connection) mid-body.
      try {
        server_->opts.abandoned(head_of(parser_->get()));
      } catch (const std::exception&) {
        // A hook that throws changes nothing for the connection.
      }
    }
    if (conn_->closed)
      return;
    if (!why) {
      // The client went away: nobody waits for the answers. (A timer that
      // closed the connection returned above.)
      close(/*by_client=*/true);
      return;
    }
    refuse(*why, std::move(message));
  }

  /// Answers `why` after the answers pending and reads no more requests.
  void refuse(http_failure why, std::string message) {
    stop_reading_ = true;
    auto s = std::make_shared<slot>(weak_from_this(), conn_, strand_, false, 11);
    s->answered = true;
    s->whole = error_response(why, std::move(message));
    slots_.push_back(std::move(s));
    pump();
  }

  /// A request's method, target, path, headers and peer, without its body.
  template <class Message>
  server_request head_of(const Message& msg) const {
    server_request req;
    req.method = std::string{msg.method_string()};
    req.target = std::string{msg.target()};
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& field : msg)
      req.headers.push_back({std::string{field.name_string()}, std::string{field.value()}});
    req.remote = remote_;
    return req;
  }

  void on_request(boost::system::error_code ec) {
    if (ec)
      return on_read_error(ec);
    release_body();
    have_header_ = false;
    reading_ = false;
    read_timer_.cancel();
    auto msg = parser_->release();
    server_request req = head_of(msg);
    req.body = std::move(msg.body());
    req.raw_body = std::move(raw_body_);
    req.raw_body_size = std::exchange(raw_body_size_, 0);
    raw_body_.reset();
    bool keep = msg.keep_alive();
    auto s = std::make_shared<slot>(weak_from_this(), conn_, strand_, keep, msg.version());
    slots_.push_back(s);
    // Unanswered requests keep the connection alive even with no I/O pending.
    hold_ = shared_from_this();
    if (!keep)
      stop_reading_ = true;
    try {
      server_->handler(std::move(req), s);
    } catch (const std::exception& e) {
      s->send(error_response(http_failure::internal_error, e.what()));
    }
    read_next();
  }

  void finish_head(bool keep) {
    write_timer_.cancel();
    writing_ = false;
    // The connection closed (the client went, a timer fired) while the
    // answer's last bytes were on their way: `close` took the pipeline.
    if (conn_->closed || slots_.empty())
      return;
    slots_.pop_front();
    // Released when this returns (it may be the last reference).
    auto last = slots_.empty() ? std::move(hold_) : nullptr;
    if (!keep || (draining_ && slots_.empty())) {
      close();
      return;
    }
    // Everything is answered: the read already waiting for the next request
    // is idle time from now on.
    if (slots_.empty() && reading_)
      arm(read_timer_, server_->opts.idle_timeout);
    read_next();
    pump();
  }

  void write_whole(const std::shared_ptr<slot>& head) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(head->version);
    res->result(head->whole->status);
    res->set(bhttp::field::server, "stitch");
    res->set(bhttp::field::content_type, head->whole->content_type);
    for (const auto& h : head->whole->headers)
      res->set(h.name, h.value);
    res->body() = std::move(head->whole->body);
    // A complete answer of any status keeps the connection (a retryable 503
    // must not cost the client a reconnect); errors of the request itself
    // come with keep_alive false already.
    bool keep = head->keep_alive && !draining_;
    res->keep_alive(keep);
    res->prepare_payload();
    writing_ = true;
    arm(write_timer_, server_->opts.write_timeout);
    with_stream([&](auto& s) {
      bhttp::async_write(s, *res,
                         net::bind_executor(strand_, [self = shared_from_this(), res,
                                                      keep](boost::system::error_code ec, size_t) {
                           if (ec) {
                             self->close(/*by_client=*/true);
                             return;
                           }
                           self->finish_head(keep);
                         }));
    });
  }

  void write_events(const std::shared_ptr<slot>& head) {
    auto done = [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->write_timer_.cancel();
      self->writing_ = false;
      if (ec) {
        self->close(/*by_client=*/true);
        return;
      }
      self->pump();
    };
    if (!head->header_written) {
      head->event_head.emplace(bhttp::status::ok, head->version);
      auto& h = *head->event_head;
      h.set(bhttp::field::server, "stitch");
      h.set(bhttp::field::content_type, "text/event-stream");
      h.set(bhttp::field::cache_control, "no-cache");
      for (const auto& x : head->event_headers)
        h.set(x.name, x.value);
      h.chunked(true);
      h.keep_alive(head->keep_alive && !draining_);
      head->event_serializer.emplace(h);
      head->header_written = true;
      writing_ = true;
      arm(write_timer_, server_->opts.write_timeout);
      with_stream([&](auto& s) {
        bhttp::async_write_header(s, *head->event_serializer, net::bind_executor(strand_, done));
      });
      return;
    }
    if (!head->chunks.empty()) {
      auto data = std::make_shared<std::string>(std::move(head->chunks.front()));
      head->chunks.pop_front();
      writing_ = true;
      arm(write_timer_, server_->opts.write_timeout);
      with_stream([&](auto& s) {
        net::async_write(s, bhttp::make_chunk(net::buffer(*data)),
                         net::bind_executor(strand_, [data, done](boost::system::error_code ec,
                                                                  size_t n) { done(ec, n); }));
      });
      return;
    }
    if (head->ended) {
      writing_ = true;
      bool keep = head->event_head->keep_alive();
      arm(write_timer_, server_->opts.write_timeout);
      with_stream([&](auto& s) {
        net::async_write(s, bhttp::make_chunk_last(),
                         net::bind_executor(strand_, [self = shared_from_this(),
                                                      keep](boost::system::error_code ec, size_t) {
                           if (ec) {
                             self->close(/*by_client=*/true);
                             return;
                           }
                           self->finish_head(keep);
                         }));
      });
    }
  }

  /// Closes the connection; `by_client`: because the client closed it or
  /// it failed (not a timer, a drain or `Connection: close`).
  void close(bool by_client = false) {
    if (conn_->closed)
      return;
    conn_->closed = true;
    conn_->closed_by_client = by_client;
    auto client_close = std::exchange(conn_->on_client_close, {});
    read_timer_.cancel();
    write_timer_.cancel();
    boost::system::error_code ec;
    raw().shutdown(tcp::socket::shutdown_both, ec);
    raw().close(ec);
    auto pending = std::move(slots_);
    slots_.clear();
    auto last = std::move(hold_);
    for (auto& s : pending)
      s->gone();
    if (by_client && client_close)
      client_close();
  }

  net::strand<net::io_context::executor_type> strand_;
  /// Plain, or TLS when the server has a context.
  std::variant<tcp::socket, tls_stream> stream_;
  std::shared_ptr<http_server::impl> server_;
  std::shared_ptr<connection_state> conn_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  /// The raw body of the request being read (`raw_large_bodies`).
  std::shared_ptr<const char[]> raw_body_;
  size_t raw_body_size_ = 0;
  std::deque<std::shared_ptr<slot>> slots_;
  std::shared_ptr<session> hold_;
  std::string remote_;
  /// The client's address (what the per-client limit counts by).
  std::string client_;
  bool reading_ = false;
  /// The current request's header was read; its body is being read.
  bool have_header_ = false;
  /// Bytes of the body being received, counted against `body_budget`.
  uint64_t reserved_ = 0;
  bool writing_ = false;
  bool stop_reading_ = false;
  bool draining_ = false;

  friend class slot;
};

template <class F>
void slot::on_strand(F f) {
  net::dispatch(strand_, [self = shared_from_this(), f = std::move(f)]() mutable {
    auto owner = self->owner_.lock();
    if (!owner || self->closed)
      return;
    f(*self, *owner);
  });
}

void slot::send(server_response response) {
  on_strand([response = std::move(response)](slot& s, session& owner) mutable {
    if (s.answered)
      return;
    s.answered = true;
    s.whole = std::move(response);
    owner.pump();
  });
}

void slot::start_events(http_headers headers) {
  on_strand([headers = std::move(headers)](slot& s, session& owner) mutable {
    if (s.answered)
      return;
    s.answered = true;
    s.events = true;
    s.event_headers = std::move(headers);
    owner.pump();
  });
}

void slot::event(std::string data) {
  on_strand([data = std::move(data)](slot& s, session& owner) mutable {
    if (!s.events || s.ended)
      return;
    s.chunks.push_back("data: " + data + "\n\n");
    owner.pump();
  });
}

void slot::end_events(bool done_marker) {
  on_strand([done_marker](slot& s, session& owner) {
    if (!s.events || s.ended)
      return;
    if (done_marker)
      s.chunks.push_back("data: [DONE]\n\n");
    s.ended = true;
    owner.pump();
  });
}

void slot::on_client_close(std::function<void()> f) {
  net::dispatch(strand_, [conn = conn_, f = std::move(f)]() mutable {
    if (!conn->closed)
      conn->on_client_close = std::move(f);
    else if (conn->closed_by_client)
      f();
  });
}

void slot::on_disconnect(std::function<void()> f) {
  net::dispatch(strand_, [self = shared_from_this(), f = std::move(f)]() mutable {
    if (self->closed || self->owner_.expired()) {
      f();
      return;
    }
    self->disconnect = std::move(f);
  });
}

} // namespace

std::shared_ptr<connection> make_session(tcp::socket socket,
                                         std::shared_ptr<http_server::impl> server) {
  return std::make_shared<session>(std::move(socket), std::move(server));
}

} // namespace stitch::transport
