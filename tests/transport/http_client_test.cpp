#include "transport/http_client.hpp"

#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <thread>

using namespace stitch;
using namespace stitch::transport;

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

/// What the test server does with one request.
struct reply {
  http::response<http::string_body> response;
  /// Close the connection after answering (without saying so).
  bool close_after = false;
  /// Read the request and never answer.
  bool hang = false;
};

/// A one-connection-at-a-time HTTP server on 127.0.0.1 for the client's tests.
class test_server {
public:
  explicit test_server(std::function<reply(const http::request<http::string_body>&)> handler)
      : handler_(std::move(handler)), acceptor_(ioc_, {net::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] { run(); });
  }
  ~test_server() {
    stopping_ = true;
    beast::error_code ec;
    // Wake the accept with a connection of our own.
    tcp::socket poke{ioc_};
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  int connections() const { return connections_; }

private:
  void run() {
    while (!stopping_) {
      tcp::socket socket{ioc_};
      beast::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stopping_)
        return;
      ++connections_;
      beast::flat_buffer buffer;
      for (;;) {
        http::request_parser<http::string_body> parser;
        parser.body_limit(64 << 20);
        http::read(socket, buffer, parser, ec);
        if (ec)
          break;
        auto r = handler_(parser.get());
        if (r.hang) {
          while (!stopping_)
            std::this_thread::sleep_for(std::chrono::milliseconds{10});
          return;
        }
        r.response.version(11);
        r.response.keep_alive(true);
        // A HEAD answer keeps the length it names without a body.
        if (!r.response.has_content_length())
          r.response.prepare_payload();
        http::write(socket, r.response, ec);
        if (ec || r.close_after)
          break;
      }
      socket.shutdown(tcp::socket::shutdown_both, ec);
      socket.close(ec);
    }
  }

  std::function<reply(const http::request<http::string_body>&)> handler_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
};

reply answer(unsigned status, std::string body) {
  reply r;
  r.response.result(status);
  r.response.set("X-Test", "yes");
  r.response.body() = std::move(body);
  return r;
}

http_client client_for(const test_server& server, http_client_options options = {}) {
  auto ep = parse_endpoint(server.url());
  EXPECT_TRUE(ep);
  return http_client{*ep, options};
}

} // namespace

TEST(http_client, reuses_one_kept_alive_connection) {
  test_server server{[](const auto& req) {
    return answer(200, std::string{req.method_string()} + " " + std::string{req.target()});
  }};
  auto client = client_for(server);
  for (int i = 0; i < 3; ++i) {
    http_request req;
    req.target = "/x/" + std::to_string(i);
    auto res = client.send(req);
    ASSERT_TRUE(res) << to_string(res.error());
    EXPECT_EQ(res->status, 200u);
    EXPECT_EQ(res->body, "GET /x/" + std::to_string(i));
    ASSERT_NE(find_header(res->headers, "x-TEST"), nullptr);
    EXPECT_EQ(*find_header(res->headers, "x-test"), "yes");
  }
  EXPECT_EQ(server.connections(), 1);
}

TEST(http_client, reconnects_when_the_server_closed_the_connection) {
  test_server server{[](const auto&) {
    auto r = answer(200, "ok");
    r.close_after = true;
    return r;
  }};
  auto client = client_for(server);
  for (int i = 0; i < 3; ++i) {
    auto res = client.send(http_request{});
    ASSERT_TRUE(res) << i << ": " << to_string(res.error());
    EXPECT_EQ(res->body, "ok");
    // Let the server's close arrive before the next request.
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
  }
  EXPECT_EQ(server.connections(), 3);
}

TEST(http_client, sends_string_and_streamed_bodies_with_headers) {
  test_server server{[](const auto& req) {
    std::string seen = std::string{req.method_string()} + " " + std::to_string(req.body().size());
    if (auto it = req.find("X-Custom"); it != req.end())
      seen += " " + std::string{it->value()};
    bool pattern = true;
    for (size_t i = 0; i < req.body().size(); ++i)
      pattern = pattern && req.body()[i] == static_cast<char>('a' + i % 26);
    return answer(201, seen + (pattern ? " pattern" : " other"));
  }};
  auto client = client_for(server);
  http_request put;
  put.method = "PUT";
  put.headers = {{"X-Custom", "v1"}};
  put.body = "abcdef";
  auto res = client.send(put);
  ASSERT_TRUE(res) << to_string(res.error());
  EXPECT_EQ(res->status, 201u);
  EXPECT_EQ(res->body, "PUT 6 v1 pattern");

  const uint64_t total = (3u << 20) + 77;
  uint64_t produced = 0;
  http_request streamed;
  streamed.method = "POST";
  streamed.producer_size = total;
  streamed.producer = [&](std::span<std::byte> out) -> result<size_t> {
    size_t n = std::min<uint64_t>(out.size(), std::min<uint64_t>(100'000, total - produced));
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<std::byte>('a' + (produced + i) % 26);
    produced += n;
    return n;
  };
  res = client.send(streamed);
  ASSERT_TRUE(res) << to_string(res.error());
  EXPECT_EQ(res->body, "POST " + std::to_string(total) + " pattern");

  // An empty PUT still says Content-Length: 0.
  http_request empty;
  empty.method = "PUT";
  res = client.send(empty);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "PUT 0 pattern");
}

TEST(http_client, a_producer_that_ends_early_is_an_error_and_the_client_recovers) {
  test_server server{
    [](const auto& req) { return answer(200, std::to_string(req.body().size())); }};
  auto client = client_for(server);
  http_request req;
  req.method = "PUT";
  req.producer_size = 1000;
  int calls = 0;
  req.producer = [&](std::span<std::byte> out) -> result<size_t> {
    return ++calls == 1 ? std::min<size_t>(out.size(), 10) : 0;
  };
  auto res = client.send(req);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::invalid_argument);
  EXPECT_NE(res.error().message.find("ended after 10 of 1000 bytes"), std::string::npos)
    << res.error().message;
  auto next = client.send(http_request{});
  ASSERT_TRUE(next) << to_string(next.error());
  EXPECT_EQ(next->body, "0");
}

/// A temporary file holding `bytes`, open for reading.
struct temp_file {
  std::string path;
  int fd = -1;
  explicit temp_file(const std::string& bytes) {
    char name[] = "/tmp/stitch-http-client-XXXXXX";
    fd = ::mkstemp(name);
    path = name;
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  ~temp_file() {
    ::close(fd);
    ::unlink(path.c_str());
  }
};

std::string pattern_of(size_t n, char first) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<char>(first + (i * 7 + i / 4096) % 26);
  return out;
}

TEST(http_client, sends_a_body_of_file_ranges_and_keeps_the_connection) {
  test_server server{[](const auto& req) { return answer(200, req.body()); }};
  auto client = client_for(server);
  const auto a = pattern_of((2u << 20) + 333, 'a');
  const auto b = pattern_of(80'000, 'A');
  temp_file fa{a}, fb{b};
  for (int round = 0; round < 2; ++round) {
    http_request put;
    put.method = "PUT";
    // Out of file order, across files, one range empty.
    put.file_body = {{fa.fd, 1000, (1u << 20)},
                     {fb.fd, 5, 70'000},
                     {fa.fd, 0, 1000},
                     {fb.fd, 0, 0},
                     {fa.fd, (1u << 20) + 1000, a.size() - (1u << 20) - 1000}};
    auto res = client.send(put);
    ASSERT_TRUE(res) << to_string(res.error());
    EXPECT_EQ(res->status, 200u);
    const std::string expected = a.substr(1000, 1u << 20) + b.substr(5, 70'000) + a.substr(0, 1000)
                                 + a.substr((1u << 20) + 1000);
    EXPECT_TRUE(res->body == expected)
      << "round " << round << ": " << res->body.size() << " of " << expected.size() << " bytes";
  }
  EXPECT_EQ(server.connections(), 1);
}

TEST(http_client, a_file_range_past_the_end_of_its_file_is_an_error_and_the_client_recovers) {
  test_server server{
    [](const auto& req) { return answer(200, std::to_string(req.body().size())); }};
  auto client = client_for(server);
  temp_file f{pattern_of(5000, 'a')};
  http_request put;
  put.method = "PUT";
  put.file_body = {{f.fd, 1000, 8000}};
  auto res = client.send(put);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::invalid_format);
  EXPECT_NE(res.error().message.find("is cut off: its file ends at byte 5000"), std::string::npos)
    << res.error().message;
  auto next = client.send(http_request{});
  ASSERT_TRUE(next) << to_string(next.error());
  EXPECT_EQ(next->body, "0");
}

TEST(http_client, refuses_responses_over_the_body_limit) {
  test_server server{[](const auto& req) {
    return answer(200, std::string(req.target() == "/big" ? 10'000 : 10, 'x'));
  }};
  auto client = client_for(server, http_client_options{.max_body_bytes = 1000});
  http_request big;
  big.target = "/big";
  auto res = client.send(big);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::limit_exceeded);
  EXPECT_NE(res.error().message.find("1000 bytes"), std::string::npos) << res.error().message;
  http_request limited;
  limited.body_limit = 5;
  res = client.send(limited);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::limit_exceeded);
  auto small = client.send(http_request{});
  ASSERT_TRUE(small) << to_string(small.error());
  EXPECT_EQ(small->body.size(), 10u);
}

TEST(http_client, head_responses_have_no_body) {
  test_server server{[](const auto&) {
    reply r;
    r.response.result(200);
    r.response.content_length(12345);
    r.response.set(http::field::etag, "\"e\"");
    return r;
  }};
  auto client = client_for(server);
  http_request head;
  head.method = "HEAD";
  for (int i = 0; i < 2; ++i) {
    auto res = client.send(head);
    ASSERT_TRUE(res) << to_string(res.error());
    EXPECT_EQ(*find_header(res->headers, "Content-Length"), "12345");
    EXPECT_TRUE(res->body.empty());
  }
}

TEST(http_client, a_silent_server_times_out_naming_the_endpoint) {
  test_server server{[](const auto&) {
    reply r;
    r.hang = true;
    return r;
  }};
  auto client =
    client_for(server, http_client_options{.io_timeout = std::chrono::milliseconds{200}});
  auto started = std::chrono::steady_clock::now();
  auto res = client.send(http_request{});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::backend_failure);
  EXPECT_NE(res.error().message.find("timed out"), std::string::npos) << res.error().message;
  EXPECT_NE(res.error().message.find(server.url()), std::string::npos) << res.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
}

TEST(http_client, a_refused_connection_is_a_backend_failure) {
  http_client client{http_endpoint{"http", "127.0.0.1", 1}};
  auto res = client.send(http_request{});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::backend_failure);
  EXPECT_NE(res.error().message.find("http://127.0.0.1:1: connecting failed"), std::string::npos)
    << res.error().message;
}

TEST(http_client, refuses_header_injection) {
  http_client client{http_endpoint{"http", "127.0.0.1", 1}};
  http_request req;
  req.headers = {{"X-Evil", "a\r\nInjected: yes"}};
  auto res = client.send(req);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, errc::invalid_argument);
  http_request target;
  target.target = "/a b\r\n";
  EXPECT_FALSE(client.send(target));
}
