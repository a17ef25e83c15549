// The replica's request lane: its own HTTP surface admits, runs and answers
// requests without the actor, sharing one lifecycle with it — so stamps,
// 409s, client disconnects, commits that wait for exact pins, and a retiring
// replica that waits for what runs hold for the lane's requests as for the
// actor's.

#include "cluster_fixture.hpp"
#include "common/eventually.hpp"

#include <future>

namespace stitch::testing {
namespace {

using namespace std::chrono_literals;

using request_lane_test = cluster_test;

TEST_F(request_lane_test, answers_with_stamps_and_refuses_with_409_on_the_replicas_own_port) {
  publish(0);
  start_replica("a");
  serve_gateway();
  const uint16_t port = serve_replica(0);
  await_ready({"a"}, 0);
  auto e = engines.at(0);
  const int forwarded = e->forwarded.load();

  auto ok = http(port, "POST", "/generate", generate_body(R"({"min_version":0})"));
  ASSERT_EQ(ok.status, 200u) << ok.body;
  EXPECT_EQ(ok.header("X-Stitch-Replica"), "a");
  EXPECT_EQ(ok.json()["meta_info"]["weight_version_start"], 0);
  EXPECT_EQ(ok.json()["meta_info"]["weight_version_end"], 0);
  EXPECT_EQ(ok.json()["meta_info"]["run_id"], "r");
  EXPECT_EQ(e->forwarded.load(), forwarded + 1);
  EXPECT_EQ(lanes.at(0)->completed_total(), 1u) << "answered by the lane, not the actor";

  auto stale = http(port, "POST", "/generate", generate_body(R"({"exact_version":3})"));
  EXPECT_EQ(stale.status, 409u) << stale.body;
  EXPECT_EQ(stale.json()["retryable"], true);
  EXPECT_EQ(e->forwarded.load(), forwarded + 1) << "a refused request never reaches the engine";

  // Both paths count into one server_info.
  auto info = http(port, "GET", "/server_info").json();
  EXPECT_EQ(info["metrics"]["requests_completed_total"], 1);
  EXPECT_EQ(info["metrics"]["requests_rejected_total"], 1);
  EXPECT_EQ(info["metrics"]["requests_admitted_total"], 1);
  // The gateway's requests still go through the actor, on the same gate.
  auto via_gateway = http(gateway_port, "POST", "/generate", generate_body());
  ASSERT_EQ(via_gateway.status, 200u) << via_gateway.body;
  info = http(port, "GET", "/server_info").json();
  EXPECT_EQ(info["metrics"]["requests_completed_total"], 2);
  EXPECT_EQ(lanes.at(0)->completed_total(), 1u);
}

TEST_F(request_lane_test, a_stream_passes_event_by_event_and_its_last_event_is_stamped) {
  publish(0);
  start_replica("a");
  const uint16_t port = serve_replica(0);
  await_ready({"a"}, 0);
  expect_stamped_stream(port);
  EXPECT_EQ(lanes.at(0)->completed_total(), 1u);
}

TEST_F(request_lane_test, a_client_that_disconnects_aborts_its_generation) {
  publish(0);
  start_replica("a");
  const uint16_t port = serve_replica(0);
  await_ready({"a"}, 0);
  auto e = engines.at(0);
  auto steps_before = abandon_generation(port, e);
  ASSERT_TRUE(steps_before) << "the cancel reached the engine";
  EXPECT_LE(e->inner.stats().steps, *steps_before + 1) << "aborted, not generated to the end";
  EXPECT_TRUE(eventually([&] { return lanes.at(0)->unanswered() == 0; }, 5s));
  EXPECT_EQ(lanes.at(0)->completed_total(), 0u);
}

TEST_F(request_lane_test, a_commit_waits_for_an_exact_pin_of_the_lane_and_then_activates) {
  publish(0);
  start_replica("a");
  const uint16_t port = serve_replica(0);
  await_ready({"a"}, 0);
  auto e = engines.at(0);
  auto hold = paused(e);
  auto pinned = std::async(std::launch::async, [&] {
    return http(port, "POST", "/generate", generate_body(R"({"exact_version":0})", 4));
  });
  ASSERT_TRUE(eventually([&] { return e->inner.requests_in_flight() == 1; }, 5s));
  publish(1);
  // The commit drains the pin: the replica stays on version 0 while it runs.
  std::this_thread::sleep_for(300ms);
  auto info = http(port, "GET", "/server_info").json();
  EXPECT_EQ(info["applied_version"], 0) << info.dump();
  hold.reset();
  auto answer = pinned.get();
  ASSERT_EQ(answer.status, 200u) << answer.body;
  EXPECT_EQ(answer.json()["meta_info"]["weight_version_start"], 0);
  EXPECT_EQ(answer.json()["meta_info"]["weight_version_end"], 0);
  // The lane's last answer let the commit proceed (the actor heard of it).
  await_ready({"a"}, 1);
  auto after = http(port, "POST", "/generate", generate_body(R"({"exact_version":1})"));
  ASSERT_EQ(after.status, 200u) << after.body;
  EXPECT_EQ(after.json()["meta_info"]["weight_version_start"], 1);
}

TEST_F(request_lane_test, a_retiring_replica_finishes_the_lanes_requests_before_it_leaves) {
  publish(0);
  auto replica = start_replica("a");
  const uint16_t port = serve_replica(0);
  await_ready({"a"}, 0);
  auto e = engines.at(0);
  auto hold = paused(e);
  auto running = std::async(
    std::launch::async, [&] { return http(port, "POST", "/generate", generate_body("null", 4)); });
  ASSERT_TRUE(eventually([&] { return e->inner.requests_in_flight() == 1; }, 5s));
  self->monitor(replica);
  self->send(replica, atom::retire_v, std::string{});
  // The retire and the next request travel separately: the request is sent
  // once the replica says it retires (before, it could be admitted first).
  ASSERT_TRUE(eventually(
    [&] {
      auto h = http(port, "GET", "/health");
      return h.status == 503 && h.body.find("retiring") != std::string::npos;
    },
    5s));
  // New requests are refused while it drains; the running one is not cut.
  auto refused = http(port, "POST", "/generate", generate_body());
  EXPECT_EQ(refused.status, 503u) << refused.body;
  bool left = false;
  self->receive([&](caf::down_msg&) { left = true; }, caf::after(200ms) >> [] {});
  EXPECT_FALSE(left) << "left with a request of the lane running";
  hold.reset();
  auto answer = running.get();
  EXPECT_EQ(answer.status, 200u) << answer.body;
  self->receive([&](caf::down_msg&) { left = true; }, caf::after(10s) >> [] {});
  EXPECT_TRUE(left) << "the replica left once the lane drained";
}

} // namespace
} // namespace stitch::testing
