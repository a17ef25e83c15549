#include <gtest/gtest.h>

#include "runtime/core/pointer_rules.hpp"

namespace stitch {
namespace {

pointer_record at(std::string run, uint64_t v, uint64_t boot = 0) {
  return pointer_record{{std::move(run), v}, boot};
}

pointer_proposal propose(std::string run, uint64_t v, bool anchor = false,
                         std::optional<uint64_t> known_boot = std::nullopt,
                         std::optional<bool> identical = std::nullopt) {
  return pointer_proposal{{std::move(run), v}, anchor, known_boot, identical};
}

TEST(pointer_rules, first_version_claims_the_run_at_its_boot) {
  auto d = decide_pointer_move(std::nullopt, propose("r", 0, true));
  ASSERT_TRUE(d) << to_string(d.error());
  EXPECT_EQ(d->move, pointer_move::claim);
  EXPECT_EQ(d->next, at("r", 0, 0));
}

TEST(pointer_rules, resuming_run_boots_above_zero) {
  auto d = decide_pointer_move(std::nullopt, propose("r", 40, true));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->next, at("r", 40, 40));
}

TEST(pointer_rules, first_version_must_be_a_full_anchor) {
  auto d = decide_pointer_move(std::nullopt, propose("r", 0, false));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::invalid_argument);
  EXPECT_NE(d.error().message.find("full anchor"), std::string::npos);
}

TEST(pointer_rules, same_run_moves_strictly_forward) {
  auto d = decide_pointer_move(at("r", 3), propose("r", 4));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->move, pointer_move::advance);
  EXPECT_EQ(d->next, at("r", 4));
  auto skip = decide_pointer_move(at("r", 3, 1), propose("r", 9));
  ASSERT_TRUE(skip);
  EXPECT_EQ(skip->next, at("r", 9, 1));
}

TEST(pointer_rules, lower_version_is_a_rewind) {
  auto d = decide_pointer_move(at("r", 5), propose("r", 4));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::rewind);
  EXPECT_NE(d.error().message.find("r/weight_v000005"), std::string::npos);
  EXPECT_NE(d.error().message.find("r/weight_v000004"), std::string::npos);
}

TEST(pointer_rules, republishing_identical_current_version_is_idempotent) {
  auto d = decide_pointer_move(at("r", 5), propose("r", 5, false, std::nullopt, true));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->move, pointer_move::unchanged);
  EXPECT_EQ(d->next, at("r", 5));
}

TEST(pointer_rules, republishing_different_content_is_version_exists) {
  auto d = decide_pointer_move(at("r", 5), propose("r", 5, false, std::nullopt, false));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::version_exists);
  auto unknown = decide_pointer_move(at("r", 5), propose("r", 5));
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, errc::version_exists);
}

TEST(pointer_rules, other_run_is_a_reset_at_any_version) {
  auto fresh = decide_pointer_move(at("a", 9), propose("b", 0, true));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->move, pointer_move::claim);
  EXPECT_EQ(fresh->next, at("b", 0, 0));
  // Back to a run claimed before: allowed at a delta, keeps that run's boot.
  auto back = decide_pointer_move(at("b", 3), propose("a", 12, false, 2));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->move, pointer_move::claim);
  EXPECT_EQ(back->next, at("a", 12, 2));
  auto below_boot = decide_pointer_move(at("b", 3), propose("a", 1, false, 2));
  ASSERT_FALSE(below_boot);
  EXPECT_EQ(below_boot.error().code, errc::rewind);
}

TEST(pointer_rules, reclaiming_the_boot_is_idempotent) {
  auto d = decide_claim(at("r", 7, 0), {"r", 0}, true, 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->move, pointer_move::unchanged);
  EXPECT_EQ(d->next, at("r", 7, 0));
  auto other_boot = decide_claim(at("r", 7, 0), {"r", 3}, true, 0);
  ASSERT_FALSE(other_boot);
  EXPECT_EQ(other_boot.error().code, errc::version_exists);
  auto delta = decide_claim(std::nullopt, {"r", 0}, false, std::nullopt);
  ASSERT_FALSE(delta);
  auto fresh = decide_claim(at("q", 2), {"r", 5}, true, std::nullopt);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->next, at("r", 5, 5));
}

TEST(pointer_rules, invalid_run_id_is_refused) {
  auto d = decide_pointer_move(std::nullopt, propose("../x", 0, true));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::invalid_argument);
}

TEST(pointer_rules, cas_conflict_names_all_three_pointers) {
  EXPECT_TRUE(check_compare_and_swap(version_ref{"r", 3}, version_ref{"r", 3}, {"r", 4}));
  EXPECT_TRUE(check_compare_and_swap(std::nullopt, std::nullopt, {"r", 0}));
  auto c = check_compare_and_swap(version_ref{"r", 3}, version_ref{"r", 5}, {"r", 4});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, errc::conflict);
  EXPECT_NE(c.error().message.find("expected r/weight_v000003"), std::string::npos);
  EXPECT_NE(c.error().message.find("found r/weight_v000005"), std::string::npos);
  EXPECT_NE(c.error().message.find("proposing r/weight_v000004"), std::string::npos);
  auto none = check_compare_and_swap(std::nullopt, version_ref{"r", 0}, {"r", 1});
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("expected (none)"), std::string::npos);
}

} // namespace
} // namespace stitch
