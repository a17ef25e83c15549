#include <gtest/gtest.h>

#include "runtime/core/retention.hpp"

namespace stitch {
namespace {

/// Versions 0..n with anchors at the given versions.
std::vector<stored_version> chain(uint64_t n, std::set<uint64_t> anchors) {
  std::vector<stored_version> out;
  for (uint64_t v = 0; v <= n; ++v)
    out.push_back({v, anchors.contains(v)});
  return out;
}

TEST(retention, keeps_newest_and_their_chain_back_to_the_anchor) {
  // 0F 1 2 3 4F 5 6 7 8F 9 ; keep 2 -> 8,9 (8 is an anchor): delete 1..7.
  auto d = select_deletions(chain(9, {0, 4, 8}), 0, 2);
  EXPECT_EQ(d, (std::set<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(retention, kept_delta_keeps_everything_back_to_its_anchor) {
  // keep 3 -> 7,8,9; 7 needs 6,5,4(anchor). Boot 0 stays.
  auto d = select_deletions(chain(9, {0, 4}), 0, 3);
  EXPECT_EQ(d, (std::set<uint64_t>{1, 2, 3}));
}

TEST(retention, boot_checkpoint_is_never_deleted) {
  // A run resumed at boot 2: versions 2F 3 4 5F.
  std::vector<stored_version> v{{2, true}, {3, false}, {4, false}, {5, true}};
  auto d = select_deletions(v, 2, 1);
  EXPECT_EQ(d, (std::set<uint64_t>{3, 4}));
}

TEST(retention, pinned_versions_and_their_chains_survive) {
  // keep 9 (needs anchor 8) and pinned 5 (needs 4..0).
  auto d = select_deletions(chain(9, {0, 8}), 0, 1, {5});
  EXPECT_EQ(d, (std::set<uint64_t>{6, 7}));
}

TEST(retention, keep_zero_means_keep_one) {
  auto d = select_deletions(chain(3, {0, 1, 2, 3}), 0, 0);
  EXPECT_EQ(d, (std::set<uint64_t>{1, 2}));
}

TEST(retention, hole_in_chain_stops_the_walk) {
  std::vector<stored_version> v{{0, true}, {1, false}, {3, false}, {4, false}};
  auto d = select_deletions(v, 0, 1);
  EXPECT_EQ(d, (std::set<uint64_t>{1})) << "3 can complete 4's chain, 1 cannot";
}

TEST(retention, nothing_to_delete_when_everything_is_kept) {
  EXPECT_TRUE(select_deletions(chain(3, {0}), 0, 10).empty());
  EXPECT_TRUE(select_deletions({}, 0, 3).empty());
}

} // namespace
} // namespace stitch

namespace stitch {
namespace {

TEST(retention_plan, says_why_each_version_is_kept) {
  // 0F boot, 1..3 deltas, 4F, 5 delta; keep 1 (5), pinned 2.
  auto plan = plan_retention(chain(5, {0, 4}), 0, 1, {2});
  ASSERT_EQ(plan.size(), 6u);
  EXPECT_EQ(plan[0], (retention_verdict{0, keep_reason::boot, 0}));
  EXPECT_EQ(plan[1], (retention_verdict{1, keep_reason::chain, 2}));
  EXPECT_EQ(plan[2], (retention_verdict{2, keep_reason::pinned, 0}));
  EXPECT_EQ(plan[3], (retention_verdict{3, keep_reason::none, 0}));
  EXPECT_EQ(plan[4], (retention_verdict{4, keep_reason::chain, 5}));
  EXPECT_EQ(plan[5], (retention_verdict{5, keep_reason::newest, 0}));
  EXPECT_EQ(to_string(plan[3].why), "deleted");
  EXPECT_EQ(to_string(plan[4].why), "chain");
}

TEST(retention_plan, first_reason_wins_and_pins_of_absent_versions_are_ignored) {
  // The boot is also among the newest: it stays "boot".
  auto plan = plan_retention(chain(1, {0}), 0, 5, {7});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].why, keep_reason::boot);
  EXPECT_EQ(plan[1].why, keep_reason::newest);
}

} // namespace
} // namespace stitch

namespace stitch {
namespace {

TEST(versions_in_use, serving_and_moving_replicas_pin_their_versions_and_the_span_between) {
  std::vector<replica_holdings> replicas{
    {version_ref{"r", 4}, std::nullopt},           // idle at 4
    {version_ref{"r", 7}, version_ref{"r", 10}},   // staging 7 -> 10: 8, 9 may be folded
    {version_ref{"old", 3}, version_ref{"r", 12}}, // run switch: the target only
    {std::nullopt, version_ref{"r", 2}},           // first fetch
  };
  auto used = versions_in_use(replicas);
  std::set<version_ref> want{{"r", 4},  {"r", 7},   {"r", 8},  {"r", 9},
                             {"r", 10}, {"old", 3}, {"r", 12}, {"r", 2}};
  EXPECT_EQ(used, want);
}

TEST(versions_in_use, the_span_of_a_far_behind_replica_is_bounded) {
  auto used = versions_in_use({{version_ref{"r", 0}, version_ref{"r", 100000}}}, 10);
  EXPECT_EQ(used.size(), 12u); // applied, target and the 10 below the target
  EXPECT_TRUE(used.contains(version_ref{"r", 99990}));
  EXPECT_FALSE(used.contains(version_ref{"r", 99989}));
}

} // namespace
} // namespace stitch
