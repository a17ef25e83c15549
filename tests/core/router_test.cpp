#include <gtest/gtest.h>

#include "core/constraint_helpers.hpp"

#include <nlohmann/json.hpp>

#include "runtime/core/router.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using namespace stitch::testing;

replica_view ready_at(uint64_t v, std::string pool = "default") {
  return {std::move(pool), true, true, v};
}

TEST(replica_router, least_outstanding_among_those_satisfying_the_constraint) {
  replica_router r;
  r.upsert(1, ready_at(3));
  r.upsert(2, ready_at(5));
  r.upsert(3, ready_at(5));
  EXPECT_EQ(r.choose("default", "", min_v(4), {}, 0s), 2u); // tie: lowest slot
  EXPECT_EQ(r.choose("default", "", min_v(4), {}, 0s), 3u); // 2 is busier now
  EXPECT_EQ(r.choose("default", "", min_v(4), {}, 0s), 2u);
  EXPECT_EQ(r.outstanding(2), 2u);
  r.finished(2);
  r.finished(2);
  EXPECT_EQ(r.choose("default", "", min_v(4), {}, 0s), 2u);
  EXPECT_EQ(r.choose("default", "", exact_v(3), {}, 0s), 1u);
  EXPECT_EQ(r.choose("default", "", exact_v(4), {}, 0s), std::nullopt);
  EXPECT_EQ(r.choose("other", "", {}, {}, 0s), std::nullopt);
  // Tried replicas are skipped.
  EXPECT_EQ(r.choose("default", "", min_v(4), {2, 3}, 0s), std::nullopt);
}

TEST(replica_router, not_ready_or_unknown_replicas_are_never_chosen) {
  replica_router r;
  r.upsert(1, {"default", true, false, 9});
  r.upsert(2, {"default", false, false, std::nullopt});
  r.upsert(3, {"default", true, true, std::nullopt});
  EXPECT_EQ(r.choose("default", "", {}, {}, 0s), std::nullopt);
  auto own = r.refuse("default", min_v(1));
  EXPECT_EQ(own.answer.status, 503);
  EXPECT_EQ(own.answer.type, "EngineUnavailable");
}

TEST(replica_router, session_sticks_while_eligible_and_moves_when_not) {
  replica_router r;
  r.upsert(1, ready_at(5));
  r.upsert(2, ready_at(5));
  EXPECT_EQ(r.choose("default", "s", {}, {}, 0s), 1u);
  // Least outstanding would now pick 2; the session stays on 1.
  EXPECT_EQ(r.choose("default", "s", {}, {}, 1s), 1u);
  EXPECT_EQ(r.choose("default", "s", {}, {}, 2s), 1u);
  // The same session name in another pool is another session.
  r.upsert(7, ready_at(5, "b"));
  EXPECT_EQ(r.choose("b", "s", {}, {}, 2s), 7u);
  // 1 stops being ready: the session moves to 2 and stays there.
  r.upsert(1, {"default", true, false, 5});
  EXPECT_EQ(r.choose("default", "s", {}, {}, 3s), 2u);
  r.upsert(1, ready_at(5));
  EXPECT_EQ(r.choose("default", "s", {}, {}, 4s), 2u);
  // A replica leaving takes its sessions along.
  r.remove(2);
  EXPECT_EQ(r.sessions(), 1u); // b's
  EXPECT_EQ(r.choose("default", "s", {}, {}, 5s), 1u);
}

TEST(replica_router, session_table_is_bounded_in_size_least_recent_first) {
  replica_router r{{3, 4, 4h}};
  r.upsert(1, ready_at(5));
  r.upsert(2, ready_at(5));
  for (int i = 0; i < 1000; ++i) {
    r.choose("default", "s" + std::to_string(i), {}, {}, std::chrono::seconds{i});
    r.finished(1);
    r.finished(2);
  }
  EXPECT_EQ(r.sessions(), 4u);
  // Touching an old entry keeps it: s996 survives the next three new sessions.
  auto s996 = r.choose("default", "s996", {}, {}, 1000s);
  for (int i = 0; i < 3; ++i)
    r.choose("default", "n" + std::to_string(i), {}, {}, 1001s);
  r.upsert(1, ready_at(5));
  r.upsert(2, ready_at(5));
  EXPECT_EQ(r.sessions(), 4u);
  // It still routes to where it went: whatever least-outstanding would say.
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(r.choose("default", "s996", {}, {}, 1002s), s996);
}

TEST(replica_router, session_entries_expire_after_the_ttl) {
  replica_router r{{3, 100, 4h}};
  r.upsert(1, ready_at(5));
  r.upsert(2, ready_at(5));
  EXPECT_EQ(r.choose("default", "old", {}, {}, 0s), 1u);
  EXPECT_EQ(r.choose("default", "fresh", {}, {}, 3h), 2u);
  EXPECT_EQ(r.sessions(), 2u);
  r.finished(1);
  r.finished(2);
  // Four hours after its last use the old session is forgotten; the fresh one is not.
  EXPECT_EQ(r.choose("default", "other", {}, {}, 4h + 1s), 1u);
  EXPECT_EQ(r.sessions(), 2u);
  r.finished(1);
  // Used within its TTL, a session lives on.
  EXPECT_EQ(r.choose("default", "fresh", {}, {}, 4h + 2s), 2u);
  EXPECT_EQ(r.choose("default", "fresh", {}, {}, 8h), 2u);
}

TEST(replica_router, retries_only_retryable_conflicts_before_anything_streamed) {
  replica_router r{{3, 10, 4h}};
  EXPECT_TRUE(r.should_retry(409, true, false, false, 1));
  EXPECT_TRUE(r.should_retry(503, true, false, false, 2));
  EXPECT_FALSE(r.should_retry(503, true, false, false, 3)); // attempts used up
  EXPECT_FALSE(r.should_retry(409, false, false, false, 1));
  EXPECT_FALSE(r.should_retry(503, true, true, false, 1));
  EXPECT_FALSE(r.should_retry(503, true, false, true, 1));
  EXPECT_FALSE(r.should_retry(500, true, false, false, 1));
  EXPECT_FALSE(r.should_retry(200, true, false, false, 1));
}

TEST(replica_router, own_409_reports_the_highest_ready_version_and_wakes_laggards) {
  replica_router r;
  r.upsert(1, ready_at(4));
  r.upsert(2, ready_at(6));
  r.upsert(3, {"default", true, false, 2}); // not ready, lagging
  r.upsert(4, ready_at(9, "other"));
  auto own = r.refuse("default", min_v(7));
  EXPECT_EQ(own.answer.status, 409);
  EXPECT_TRUE(own.answer.retryable);
  auto body = nlohmann::json::parse(own.answer.body());
  EXPECT_EQ(body["target_version"], 7);
  EXPECT_EQ(body["applied"], 6);
  EXPECT_EQ(own.wake, (std::vector<replica_slot>{1, 2, 3}));
}

TEST(replica_router, exact_pin_the_pool_moved_past_is_final) {
  replica_router r;
  r.upsert(1, ready_at(6));
  r.upsert(2, {"default", true, false, 4}); // holds 4, not ready
  // 5 is past and nobody holds it: final.
  auto gone = r.refuse("default", exact_v(5));
  EXPECT_EQ(gone.answer.status, 409);
  EXPECT_FALSE(gone.answer.retryable);
  EXPECT_EQ(gone.answer.retry_after, 0u);
  // 4 is held by a replica (it may become ready): retryable.
  EXPECT_TRUE(r.refuse("default", exact_v(4)).answer.retryable);
  // 8 is ahead: retryable.
  EXPECT_TRUE(r.refuse("default", exact_v(8)).answer.retryable);
  // No constraint and nothing eligible is a 503, not a 409.
  EXPECT_EQ(r.refuse("nope", {}).answer.status, 503);
}

} // namespace
} // namespace stitch
