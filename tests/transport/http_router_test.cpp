#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "transport/http_router.hpp"

namespace stitch::transport {
namespace {

server_request make(std::string method, std::string path, std::string body = {},
                    http_headers headers = {}) {
  server_request r;
  r.method = std::move(method);
  r.target = path;
  r.path = std::move(path);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

template <class T>
const T& as(const route_decision& d) {
  if (!std::holds_alternative<T>(d)) {
    if (auto* r = std::get_if<routed::refuse>(&d))
      ADD_FAILURE() << "refused " << r->response.status << ": " << r->response.body;
    else
      ADD_FAILURE() << "unexpected decision " << d.index();
    static T empty{};
    return empty;
  }
  return std::get<T>(d);
}

/// The refusal's status, and its message (checked to be in the error shape).
std::pair<unsigned, std::string> refused(const route_decision& d) {
  const auto& r = as<routed::refuse>(d);
  auto j = nlohmann::json::parse(r.response.body);
  EXPECT_EQ(j["error"]["message"], j["message"]);
  return {r.response.status, j["message"].get<std::string>()};
}

router_options opts;

TEST(http_router, stitch_routes_and_their_methods) {
  as<routed::health>(route_request(surface::replica, make("GET", "/health"), opts));
  as<routed::server_info>(route_request(surface::replica, make("GET", "/server_info"), opts));
  as<routed::wake>(route_request(surface::replica, make("POST", "/wake"), opts));
  as<routed::pool_view>(route_request(surface::gateway, make("GET", "/pool"), opts));
  auto bad = route_request(surface::replica, make("POST", "/health"), opts);
  EXPECT_EQ(refused(bad).first, 405u);
  EXPECT_EQ(std::get<routed::refuse>(bad).response.headers.at(0).name, "Allow");
  EXPECT_EQ(refused(route_request(surface::replica, make("GET", "/wake"), opts)).first, 405u);
  EXPECT_EQ(refused(route_request(surface::replica, make("GET", "/generate"), opts)).first, 405u);
  // The gateway has no server_info of its own: it passes through.
  as<routed::passthrough>(route_request(surface::gateway, make("GET", "/server_info"), opts));
}

TEST(http_router, wake_needs_the_admin_token_when_one_is_set) {
  router_options secured;
  secured.admin_token = "s3cret";
  EXPECT_EQ(refused(route_request(surface::gateway, make("POST", "/wake"), secured)).first, 401u);
  EXPECT_EQ(
    refused(route_request(surface::gateway,
                          make("POST", "/wake", "", {{"Authorization", "Bearer s3cre"}}), secured))
      .first,
    401u);
  EXPECT_EQ(
    refused(route_request(surface::gateway,
                          make("POST", "/wake", "", {{"Authorization", "s3cret"}}), secured))
      .first,
    401u);
  as<routed::wake>(route_request(
    surface::gateway, make("POST", "/wake", "", {{"authorization", "Bearer s3cret"}}), secured));
}

TEST(http_router, versioned_routes_take_the_constraint_out_of_the_body) {
  auto d =
    route_request(surface::replica,
                  make("POST", "/generate",
                       R"({"text":"hi","weight_version":{"min_version":"3","exact_version":null}})",
                       {{"Content-Type", "application/json; charset=utf-8"}}),
                  opts);
  const auto& v = as<routed::versioned>(d);
  EXPECT_EQ(v.route, "/generate");
  EXPECT_EQ(v.c.min_version, 3u);
  EXPECT_FALSE(v.c.exact_version);
  EXPECT_EQ(v.body, R"({"text":"hi"})");
  EXPECT_EQ(v.pool, "default");

  auto h = route_request(surface::gateway,
                         make("POST", "/v1/completions", R"({"prompt":"x"})",
                              {{"X-Stitch-Min-Version", "2"}, {"X-Stitch-Exact-Version", "4"}}),
                         opts);
  EXPECT_EQ(as<routed::versioned>(h).c, (constraint{2, 4}));
}

TEST(http_router, every_bad_request_is_a_4xx_naming_the_problem) {
  auto [s1, m1] = refused(route_request(
    surface::replica,
    make("POST", "/generate", R"({"text":"hi"})", {{"Content-Type", "text/plain"}}), opts));
  EXPECT_EQ(s1, 415u);
  EXPECT_NE(m1.find("application/json"), std::string::npos);
  auto [s2, m2] = refused(route_request(surface::replica, make("POST", "/generate", "{"), opts));
  EXPECT_EQ(s2, 400u);
  EXPECT_NE(m2.find("JSON"), std::string::npos) << m2;
  auto [s3, m3] = refused(route_request(
    surface::replica, make("POST", "/generate", R"({"weight_version":{"min_version":-1}})"), opts));
  EXPECT_EQ(s3, 400u);
  EXPECT_NE(m3.find("min_version"), std::string::npos) << m3;
  auto [s4, m4] =
    refused(route_request(surface::replica,
                          make("POST", "/generate", R"({"weight_version":{"min_version":5}})",
                               {{"X-Stitch-Min-Version", "6"}}),
                          opts));
  EXPECT_EQ(s4, 400u);
  EXPECT_NE(m4.find("X-Stitch-Min-Version"), std::string::npos) << m4;
  auto [s5, m5] = refused(route_request(
    surface::replica, make("POST", "/generate", "{}", {{"X-Stitch-Exact-Version", "1e3"}}), opts));
  EXPECT_EQ(s5, 400u);
  EXPECT_NE(m5.find("X-Stitch-Exact-Version"), std::string::npos) << m5;
  auto [s6, m6] = refused(route_request(
    surface::replica,
    make("POST", "/generate", R"({"weight_version":{"min_version":5,"exact_version":4}})"), opts));
  EXPECT_EQ(s6, 400u);
  auto [s7, m7] = refused(route_request(surface::replica, make("POST", "/generate", "[1]"), opts));
  EXPECT_EQ(s7, 400u);
  EXPECT_NE(m7.find("JSON object"), std::string::npos) << m7;
}

TEST(http_router, pools_and_sessions) {
  auto prefixed =
    route_request(surface::gateway, make("POST", "/pools/exp-1/generate", "{}"), opts);
  EXPECT_EQ(as<routed::versioned>(prefixed).pool, "exp-1");
  EXPECT_EQ(as<routed::versioned>(prefixed).route, "/generate");
  EXPECT_EQ(
    as<routed::health>(route_request(surface::gateway, make("GET", "/pools/p/health"), opts)).pool,
    "p");
  auto header = route_request(
    surface::gateway,
    make("POST", "/generate", "{}", {{"X-Stitch-Pool", "blue"}, {"Modal-Session-ID", "s-9"}}),
    opts);
  EXPECT_EQ(as<routed::versioned>(header).pool, "blue");
  EXPECT_EQ(as<routed::versioned>(header).session, "s-9");
  auto both = route_request(
    surface::gateway,
    make("POST", "/generate", "{}", {{"X-Session-Id", "a"}, {"Modal-Session-ID", "b"}}), opts);
  EXPECT_EQ(as<routed::versioned>(both).session, "a");
  EXPECT_EQ(
    refused(route_request(surface::gateway, make("POST", "/pools/../generate", "{}"), opts)).first,
    400u);
  EXPECT_EQ(refused(route_request(surface::gateway,
                                  make("GET", "/health", "", {{"X-Stitch-Pool", "a b"}}), opts))
              .first,
            400u);
  EXPECT_EQ(
    refused(route_request(surface::gateway, make("POST", "/pools/a%20b/generate", "{}"), opts))
      .first,
    400u);
  EXPECT_TRUE(valid_pool_name("default"));
  EXPECT_FALSE(valid_pool_name(std::string(65, 'a')));
}

TEST(http_router, other_routes_pass_through_unchanged) {
  auto d = route_request(surface::replica, make("GET", "/v1/models"), opts);
  const auto& p = as<routed::passthrough>(d);
  EXPECT_EQ(p.method, "GET");
  EXPECT_EQ(p.route, "/v1/models");
  auto ctl = route_request(surface::replica, make("POST", "/update_weights_from_disk", "{}"), opts);
  EXPECT_EQ(as<routed::passthrough>(ctl).route, "/update_weights_from_disk");
}

} // namespace
} // namespace stitch::transport
