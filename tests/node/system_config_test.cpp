#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <gtest/gtest.h>

#include "actors/messages.hpp"
#include "runtime/node/system_config.hpp"

namespace {

class caf_types_test : public ::testing::Test {
protected:
  caf_types_test() : sys(cfg) {}
  stitch::system_config cfg;
  caf::actor_system sys;
};

TEST_F(caf_types_test, domain_error_round_trips_through_caf) {
  stitch::error err{stitch::errc::version_exists, "r1/weight_v000003 differs"};
  auto converted = stitch::to_caf_error(err);
  EXPECT_EQ(converted.category(), caf::atom("stitch"));
  EXPECT_EQ(stitch::from_caf_error(sys, converted), err);
}

TEST_F(caf_types_test, rendering_names_category_code_and_message) {
  auto rendered = sys.render(stitch::to_caf_error({stitch::errc::rewind, "from 7 to 3"}));
  EXPECT_NE(rendered.find("rewind"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("from 7 to 3"), std::string::npos) << rendered;
}

TEST_F(caf_types_test, foreign_caf_errors_become_backend_failures) {
  auto err = stitch::from_caf_error(sys, caf::make_error(caf::sec::request_timeout));
  EXPECT_EQ(err.code, stitch::errc::backend_failure);
  EXPECT_NE(err.message.find("request_timeout"), std::string::npos) << err.message;
}

TEST_F(caf_types_test, pointer_record_serializes_round_trip) {
  stitch::pointer_record in{{"run-a", 42}, 7};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(in));
  stitch::pointer_record out;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(out));
  EXPECT_EQ(in, out);
}

} // namespace
