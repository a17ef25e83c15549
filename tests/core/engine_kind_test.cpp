// The closed sets of `engine.kind` and `engine.device`: each name parses to
// its value and prints back; anything else is refused naming it.
#include "runtime/core/engine_kind.hpp"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(engine_kind, every_kind_round_trips_and_others_are_refused_by_name) {
  for (auto k : {engine_kind::builtin, engine_kind::sglang, engine_kind::vllm})
    EXPECT_EQ(*parse_engine_kind(to_string(k)), k);
  EXPECT_EQ(to_string(engine_kind::vllm), "vllm");
  auto bad = parse_engine_kind("tensorrt");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("'tensorrt'"), std::string::npos);
  EXPECT_FALSE(parse_engine_kind("SGLang"));
}

TEST(engine_kind, engine_device_parses_cpu_and_cuda_only) {
  EXPECT_EQ(*parse_engine_device("cpu"), engine_device::cpu);
  EXPECT_EQ(*parse_engine_device("cuda"), engine_device::cuda);
  auto bad = parse_engine_device("gpu");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("'gpu'"), std::string::npos);
  EXPECT_EQ(to_string(engine_device::cuda), "cuda");
}

} // namespace
} // namespace stitch
