#include <gtest/gtest.h>

#include <vector>

#include "runtime/core/publish_plan.hpp"

namespace stitch {
namespace {

publish_facts facts(uint64_t v, std::optional<remembered_version> prev = std::nullopt) {
  publish_facts f;
  f.pool = "default";
  f.ref = {"r", v};
  f.remembered = std::move(prev);
  f.anchor_every = 10;
  return f;
}

remembered_version at(uint64_t v, std::optional<uint64_t> anchor = 0) {
  return remembered_version{v, anchor, std::nullopt};
}

std::vector<delta_effect> list(const delta_effects& e) {
  return {e.begin(), e.end()};
}

using k = delta_effect::kind;

TEST(publish_plan, next_version_of_a_remembered_run_is_a_delta_that_reads_and_rewrites_the_copy) {
  auto d = decide_publish(facts(4, at(3)));
  EXPECT_EQ(d.mode, publish_mode::delta);
  EXPECT_TRUE(d.reason.empty());
  EXPECT_TRUE(d.read_remembered);
  EXPECT_TRUE(d.rewrite_remembered);
  EXPECT_FALSE(d.against_remembered);
}

TEST(publish_plan, each_reason_for_an_anchor_is_named) {
  auto f = facts(4, at(3));
  f.force_anchor = true;
  EXPECT_EQ(decide_publish(f).reason, "requested (--anchor)");

  auto first = decide_publish(facts(0));
  EXPECT_EQ(first.mode, publish_mode::anchor);
  EXPECT_EQ(first.reason, "first version of run 'r' in pool 'default' this publisher has seen");
  EXPECT_FALSE(first.read_remembered);
  EXPECT_TRUE(first.rewrite_remembered);

  EXPECT_EQ(decide_publish(facts(3, at(3))).reason,
            "the store no longer holds the remembered version");
  EXPECT_EQ(decide_publish(facts(6, at(3))).reason, "the previous version in memory is 3, not 5");

  auto changed = at(3);
  changed.layout_change = "tensor 'w' is new";
  EXPECT_EQ(decide_publish(facts(4, changed)).reason, "the tensor set changed: tensor 'w' is new");
  EXPECT_EQ(decide_publish(facts(4, at(3, std::nullopt))).reason,
            "the run's last anchor is unknown");
  EXPECT_EQ(decide_publish(facts(10, at(9, 0))).reason,
            "10 versions since anchor 0 (anchor_every = 10)");
  EXPECT_EQ(decide_publish(facts(9, at(8, 0))).mode, publish_mode::delta);

  auto no_cadence = facts(50, at(49, 0));
  no_cadence.anchor_every = 0;
  EXPECT_EQ(decide_publish(no_cadence).mode, publish_mode::delta);
}

TEST(publish_plan, a_stored_version_is_verified_against_the_store) {
  auto f = facts(4, at(3));
  f.stored = true;
  f.force_anchor = true;
  auto d = decide_publish(f);
  EXPECT_EQ(d.mode, publish_mode::verify);
  EXPECT_TRUE(d.reason.empty());
  EXPECT_FALSE(d.against_remembered);
  // Not the remembered version: the copy is rewritten with the bytes.
  EXPECT_FALSE(d.read_remembered);
  EXPECT_TRUE(d.rewrite_remembered);

  // The remembered version again: compared with the copy, which stays.
  auto again = facts(3, at(3));
  again.stored = true;
  auto same = decide_publish(again);
  EXPECT_EQ(same.mode, publish_mode::verify);
  EXPECT_TRUE(same.read_remembered);
  EXPECT_FALSE(same.rewrite_remembered);
}

TEST(publish_plan, a_dry_run_never_rewrites_the_copy) {
  auto f = facts(3, at(3));
  f.dry_run = true;
  auto d = decide_publish(f);
  EXPECT_EQ(d.mode, publish_mode::verify);
  EXPECT_TRUE(d.against_remembered);
  EXPECT_FALSE(d.rewrite_remembered);

  auto next = facts(4, at(3));
  next.dry_run = true;
  auto delta = decide_publish(next);
  EXPECT_EQ(delta.mode, publish_mode::delta);
  EXPECT_TRUE(delta.read_remembered);
  EXPECT_FALSE(delta.rewrite_remembered);
}

TEST(publish_plan, an_unchanged_tensor_stores_nothing) {
  delta_tensor_coder c;
  EXPECT_EQ(list(c.chunk(8, true)).size(), 0U);
  EXPECT_EQ(list(c.chunk(8, true)).size(), 0U);
  EXPECT_EQ(list(c.finish()).size(), 0U);
  EXPECT_FALSE(c.touched());
}

TEST(publish_plan, a_changed_tensor_begins_with_the_zeros_of_its_unchanged_start) {
  delta_tensor_coder c;
  EXPECT_TRUE(list(c.chunk(8, true)).empty());
  EXPECT_TRUE(list(c.chunk(4, true)).empty());
  EXPECT_EQ(list(c.chunk(8, false)),
            (std::vector<delta_effect>{{k::begin, 0}, {k::zeros, 12}, {k::xor_bytes, 8}}));
  EXPECT_EQ(list(c.chunk(8, true)), (std::vector<delta_effect>{{k::zeros, 8}}));
  EXPECT_EQ(list(c.chunk(2, false)), (std::vector<delta_effect>{{k::xor_bytes, 2}}));
  EXPECT_EQ(list(c.finish()), (std::vector<delta_effect>{{k::end, 0}}));
  EXPECT_TRUE(c.touched());
}

TEST(publish_plan, a_change_in_the_first_chunk_has_no_leading_zeros) {
  delta_tensor_coder c;
  EXPECT_EQ(list(c.chunk(8, false)), (std::vector<delta_effect>{{k::begin, 0}, {k::xor_bytes, 8}}));
}

TEST(publish_plan, the_pointer_is_claimed_only_for_a_new_run_anchor) {
  const version_ref v4{"r", 4};
  EXPECT_EQ(decide_pointer_step(v4, v4, true, false), pointer_step::none);
  EXPECT_EQ(decide_pointer_step(version_ref{"r", 3}, v4, true, false), pointer_step::advance);
  EXPECT_EQ(decide_pointer_step(version_ref{"r", 3}, v4, false, true), pointer_step::advance);
  EXPECT_EQ(decide_pointer_step(std::nullopt, v4, false, false), pointer_step::advance);
  EXPECT_EQ(decide_pointer_step(std::nullopt, v4, false, true), pointer_step::claim);
  EXPECT_EQ(decide_pointer_step(version_ref{"other", 9}, v4, false, true), pointer_step::claim);
  EXPECT_EQ(decide_pointer_step(version_ref{"other", 9}, v4, true, true), pointer_step::advance);
}

TEST(publish_plan, the_last_anchor_follows_the_chain) {
  EXPECT_EQ(last_anchor_after(7, true, std::nullopt), 7U);
  EXPECT_EQ(last_anchor_after(7, false, at(6, 2)), 2U);
  EXPECT_EQ(last_anchor_after(7, false, at(5, 2)), std::nullopt);
  EXPECT_EQ(last_anchor_after(7, false, std::nullopt), std::nullopt);
}

} // namespace
} // namespace stitch
