#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/core/stage_plan.hpp"

namespace stitch {
namespace {

chain_plan seeding() {
  chain_plan p;
  p.target = {"r", 3};
  p.anchor = version_ref{"r", 2};
  p.deltas = {{"r", 3}};
  p.touched = {"a", "b", "c"};
  return p;
}

chain_plan building_on() {
  chain_plan p;
  p.target = {"r", 5};
  p.deltas = {{"r", 4}, {"r", 5}};
  p.touched = {"b"};
  return p;
}

const std::vector<std::string> names{"a", "b", "c"};

TEST(stage_plan, seeding_wants_every_tensor_whole_and_checks_each_it_reads) {
  stage_ledger l{seeding()};
  EXPECT_EQ(l.wanted_whole(names), names);
  for (const auto& n : names) {
    EXPECT_EQ(l.arrival(n), tensor_arrival::read_from_anchor);
    EXPECT_EQ(l.check(n), tensor_check::checksum);
    EXPECT_TRUE(l.needs_patch(n));
  }
}

TEST(stage_plan, building_on_wants_only_the_touched_and_leaves_the_rest_shared_unchecked) {
  stage_ledger l{building_on()};
  EXPECT_EQ(l.wanted_whole(names), std::vector<std::string>{"b"});
  EXPECT_EQ(l.arrival("a"), tensor_arrival::shared_with_base);
  EXPECT_EQ(l.check("a"), tensor_check::none);
  EXPECT_EQ(l.check("c"), tensor_check::none);
  // Touched but not yet rewritten: checked anyway.
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
}

TEST(stage_plan, a_tensor_a_holder_gave_whole_is_neither_patched_nor_checked_again) {
  stage_ledger l{seeding()};
  l.arrived("b", tensor_arrival::whole_from_holder);
  EXPECT_TRUE(l.whole("b"));
  EXPECT_FALSE(l.needs_patch("b"));
  EXPECT_EQ(l.check("b"), tensor_check::none);
  EXPECT_EQ(l.wanted_whole(names), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(l.from_holders(), std::vector<std::string>{"b"});
}

TEST(stage_plan, a_tensor_from_a_local_gpu_is_not_patched_but_is_checked_on_the_device) {
  stage_ledger l{building_on()};
  l.arrived("b", tensor_arrival::from_local_gpu);
  EXPECT_FALSE(l.needs_patch("b"));
  EXPECT_FALSE(l.whole("b"));
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
  EXPECT_TRUE(l.from_holders().empty());
  EXPECT_TRUE(l.wanted_whole(names).empty());
}

TEST(stage_plan, a_patched_tensor_is_checked) {
  stage_ledger l{building_on()};
  l.patched("b");
  EXPECT_EQ(l.arrival("b"), tensor_arrival::patched);
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
  EXPECT_EQ(to_string(tensor_arrival::patched), "patched");
}

} // namespace
} // namespace stitch
