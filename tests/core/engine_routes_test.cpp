#include <gtest/gtest.h>

#include "runtime/core/engine_routes.hpp"

namespace stitch {
namespace {

constexpr engine_route routes[] = {
  {"GET", "/v1/models", "test"},
  {"GET", "/v1/models/{}", "test"},
  {"POST", "/tokenize", "test"},
};

TEST(engine_routes, only_listed_methods_and_paths_pass) {
  EXPECT_TRUE(route_listed(routes, "GET", "/v1/models"));
  EXPECT_TRUE(route_listed(routes, "POST", "/tokenize"));
  EXPECT_FALSE(route_listed(routes, "POST", "/v1/models"));
  EXPECT_FALSE(route_listed(routes, "GET", "/tokenize"));
  EXPECT_FALSE(route_listed(routes, "GET", "/v1/models/"));
  EXPECT_FALSE(route_listed(routes, "GET", "/v1/modelsx"));
  EXPECT_FALSE(route_listed(routes, "GET", "/V1/models"));
  EXPECT_FALSE(route_listed(routes, "GET", "/tokenize/"));
  EXPECT_FALSE(route_listed(routes, "GET", ""));
  EXPECT_FALSE(route_listed({}, "GET", "/v1/models"));
}

TEST(engine_routes, a_hole_takes_plain_segments_and_never_a_way_out) {
  EXPECT_TRUE(route_listed(routes, "GET", "/v1/models/Qwen3-8B"));
  EXPECT_TRUE(route_listed(routes, "GET", "/v1/models/Qwen/Qwen3-8B"));
  EXPECT_TRUE(route_listed(routes, "GET", "/v1/models/meta-llama/Llama-3.1-8B:v2"));
  for (const char* hostile :
       {"/v1/models/../flush_cache", "/v1/models/./x", "/v1/models/a//b", "/v1/models/a/",
        "/v1/models/x%2F..%2Fflush_cache", "/v1/models/a b", "/v1/models/a?b", "/v1/models/..",
        "/v1/models/a\\b", "/v1/models/\xc3\xa9"})
    EXPECT_FALSE(route_listed(routes, "GET", hostile)) << hostile;
}

TEST(engine_routes, a_refusal_names_the_route_the_engine_and_the_method_it_takes) {
  EXPECT_FALSE(route_refusal(routes, "sglang", "GET", "/v1/models"));
  auto why = route_refusal(routes, "sglang", "POST", "/update_weights_from_disk");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("POST /update_weights_from_disk"), std::string::npos) << *why;
  EXPECT_NE(why->find("sglang"), std::string::npos) << *why;
  auto method = route_refusal(routes, "vllm", "DELETE", "/v1/models");
  ASSERT_TRUE(method);
  EXPECT_NE(method->find("/v1/models takes GET"), std::string::npos) << *method;
  // A hostile path is quoted, never echoed raw.
  auto hostile = route_refusal(routes, "vllm", "GET", std::string_view{"/a\n\x01", 4});
  ASSERT_TRUE(hostile);
  EXPECT_EQ(hostile->find('\n'), std::string::npos) << *hostile;
}

} // namespace
} // namespace stitch
