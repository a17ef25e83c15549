#include <gtest/gtest.h>

#include "core/constraint_helpers.hpp"

#include <nlohmann/json.hpp>

#include "runtime/core/request_lifecycle.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using namespace stitch::testing;
namespace fx = request_effects;

constexpr auto versioned = request_kind::versioned;
constexpr auto passthrough = request_kind::passthrough;

request_lifecycle serving(uint64_t version, clock_time drain_timeout = 300s) {
  request_lifecycle l{admission_gate::options{drain_timeout, 4096}};
  l.serve(version);
  return l;
}

engine_outcome ok() {
  return {true, std::nullopt};
}

/// The effects as short text, in order: easy to compare whole.
std::vector<std::string> names(const std::vector<request_effect>& effects) {
  std::vector<std::string> out;
  for (const auto& e : effects)
    std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, fx::start>)
          out.push_back("start " + std::to_string(x.id) + "@"
                        + (x.served ? std::to_string(*x.served) : "-"));
        else if constexpr (std::is_same_v<T, fx::stop>)
          out.push_back("stop " + std::to_string(x.id));
        else if constexpr (std::is_same_v<T, fx::deliver>)
          out.push_back("deliver " + std::to_string(x.id)
                        + (x.stamped ? " [" + std::to_string(x.stamped->start) + ","
                                         + std::to_string(x.stamped->end) + "]"
                                     : ""));
        else if constexpr (std::is_same_v<T, fx::fail>)
          out.push_back("fail " + std::to_string(x.id) + " " + std::to_string(x.error.status) + " "
                        + x.error.type);
        else if constexpr (std::is_same_v<T, fx::reconcile_now>)
          out.push_back("reconcile");
        else
          out.push_back("proceed");
      },
      e);
  return out;
}

using list = std::vector<std::string>;

TEST(request_lifecycle, admitted_request_starts_and_is_delivered_stamped) {
  auto l = serving(5);
  EXPECT_EQ(names(l.arrive(1, versioned, min_v(4), 0s)), (list{"start 1@5"}));
  EXPECT_TRUE(l.running(1));
  EXPECT_EQ(names(l.engine_done(1, ok(), 1s)), (list{"deliver 1 [5,5]"}));
  EXPECT_EQ(l.unanswered(), 0u);
  // A second report for the same request changes nothing.
  EXPECT_TRUE(l.engine_done(1, ok(), 2s).empty());
}

TEST(request_lifecycle, unsatisfied_constraint_is_409_then_reconcile) {
  auto l = serving(5);
  auto fx = l.arrive(1, versioned, min_v(7), 0s);
  ASSERT_EQ(names(fx), (list{"fail 1 409 WeightVersionNotReady", "reconcile"}));
  const auto& e = std::get<fx::fail>(fx[0]).error;
  EXPECT_TRUE(e.retryable);
  EXPECT_EQ(e.retry_after, 1u);
  ASSERT_TRUE(e.not_ready);
  EXPECT_EQ(e.not_ready->target_version, 7u);
  auto body = nlohmann::json::parse(e.body());
  EXPECT_EQ(body["type"], "WeightVersionNotReady");
  EXPECT_EQ(body["error"]["type"], "WeightVersionNotReady");
  EXPECT_EQ(body["applied"], 5);
  EXPECT_EQ(l.unanswered(), 0u);
}

TEST(request_lifecycle, nothing_served_is_503_with_the_reason) {
  request_lifecycle l;
  l.stop_serving("no run claimed");
  auto fx = l.arrive(1, versioned, any(), 0s);
  ASSERT_EQ(names(fx), (list{"fail 1 503 EngineUnavailable"}));
  EXPECT_EQ(std::get<fx::fail>(fx[0]).error.message, "no run claimed");
  // A passthrough route does not need weights.
  EXPECT_EQ(names(l.arrive(2, passthrough, any(), 0s)), (list{"start 2@-"}));
  EXPECT_EQ(names(l.engine_done(2, {false, std::nullopt}, 1s)), (list{"deliver 2"}));
}

TEST(request_lifecycle, duplicate_id_is_refused_without_touching_the_first) {
  auto l = serving(1);
  l.arrive(1, versioned, any(), 0s);
  EXPECT_EQ(names(l.arrive(1, versioned, any(), 0s)), (list{"fail 1 400 BadRequest"}));
  EXPECT_TRUE(l.running(1));
  EXPECT_EQ(names(l.engine_done(1, ok(), 1s)), (list{"deliver 1 [1,1]"}));
}

TEST(request_lifecycle, in_place_commit_lets_floors_cross_and_stamps_the_interval) {
  auto l = serving(5);
  l.arrive(1, versioned, min_v(0), 0s);
  // Nothing the in-place commit waits for: it proceeds at once.
  EXPECT_EQ(names(l.begin_commit(commit_mode::in_place, false, 1s)), (list{"proceed"}));
  // Arrivals during the activation queue, and start after it on the new version.
  EXPECT_TRUE(l.arrive(2, versioned, any(), 2s).empty());
  EXPECT_FALSE(l.running(2));
  EXPECT_EQ(names(l.end_commit(6, 3s)), (list{"start 2@6"}));
  // The crossing request reports both versions.
  EXPECT_EQ(names(l.engine_done(1, ok(), 4s)), (list{"deliver 1 [5,6]"}));
  EXPECT_EQ(names(l.engine_done(2, ok(), 4s)), (list{"deliver 2 [6,6]"}));
}

TEST(request_lifecycle, the_end_stamp_covers_a_token_made_before_the_host_heard_the_activation) {
  auto l = serving(5);
  l.arrive(1, versioned, min_v(0), 0s);
  l.arrive(2, versioned, exact_v(5), 0s);
  // The engine activated 6 and made request 1's last token with it; the
  // host has not heard yet (the gate still serves 5). An exact pin says
  // its pin whatever (only equal weights can move under it).
  engine_outcome made_by_6{true, std::nullopt, 6};
  EXPECT_EQ(names(l.engine_done(1, made_by_6, 1s)), (list{"deliver 1 [5,6]"}));
  EXPECT_EQ(names(l.engine_done(2, made_by_6, 1s)), (list{"deliver 2 [5,5]"}));
  // An engine that reports an older version changes nothing.
  l.arrive(3, versioned, any(), 2s);
  EXPECT_EQ(names(l.engine_done(3, engine_outcome{true, std::nullopt, 4}, 3s)),
            (list{"deliver 3 [5,5]"}));
}

TEST(request_lifecycle, exact_pin_holds_the_commit_until_it_finishes) {
  auto l = serving(5);
  l.arrive(1, versioned, exact_v(5), 0s);
  EXPECT_TRUE(l.begin_commit(commit_mode::in_place, false, 1s).empty());
  // A pin of the old version arriving now queues, and the new version cannot satisfy it.
  EXPECT_TRUE(l.arrive(2, versioned, exact_v(5), 1s).empty());
  EXPECT_EQ(names(l.engine_done(1, ok(), 2s)), (list{"deliver 1 [5,5]", "proceed"}));
  EXPECT_EQ(names(l.end_commit(6, 3s)), (list{"fail 2 409 WeightVersionNotReady", "reconcile"}));
}

TEST(request_lifecycle, drain_timeout_stops_the_holder_and_answers_drain_timeout) {
  auto l = serving(5, 10s);
  l.arrive(1, versioned, exact_v(5), 0s);
  l.begin_commit(commit_mode::quiesce, false, 1s);
  EXPECT_TRUE(l.tick(5s).empty());
  EXPECT_EQ(names(l.tick(12s)), (list{"stop 1", "proceed"}));
  // The engine reports the stopped request: its answer is the drain timeout,
  // whatever the engine said.
  auto fx = l.engine_done(1, ok(), 12s);
  ASSERT_EQ(names(fx), (list{"fail 1 503 DrainTimeout"}));
  EXPECT_TRUE(std::get<fx::fail>(fx[0]).error.retryable);
  EXPECT_EQ(std::get<fx::fail>(fx[0]).error.retry_after, 1u);
  EXPECT_EQ(l.gate().metrics().drain_timeouts_total, 1u);
}

TEST(request_lifecycle, client_cancel_of_a_running_request_stops_it_then_499) {
  auto l = serving(5);
  l.arrive(1, versioned, any(), 0s);
  EXPECT_EQ(names(l.cancel(1, 1s)), (list{"stop 1"}));
  EXPECT_EQ(names(l.engine_done(1, ok(), 2s)), (list{"fail 1 499 ClientClosedRequest"}));
  // Cancelling what is already answered is a no-op.
  EXPECT_TRUE(l.cancel(1, 3s).empty());
}

TEST(request_lifecycle, cancel_of_a_queued_request_answers_at_once_and_may_unblock) {
  auto l = serving(5);
  l.arrive(1, versioned, exact_v(5), 0s);
  l.begin_commit(commit_mode::in_place, false, 1s);
  l.arrive(2, versioned, any(), 1s);
  EXPECT_EQ(names(l.cancel(2, 2s)), (list{"fail 2 499 ClientClosedRequest"}));
  EXPECT_EQ(names(l.engine_done(1, ok(), 3s)), (list{"deliver 1 [5,5]", "proceed"}));
  EXPECT_TRUE(l.end_commit(6, 4s).empty());
}

TEST(request_lifecycle, activation_failure_stops_everything_running_then_503) {
  auto l = serving(5);
  l.arrive(2, versioned, any(), 0s);
  l.arrive(1, passthrough, any(), 0s);
  EXPECT_EQ(names(l.begin_commit(commit_mode::in_place, false, 1s)), (list{"proceed"}));
  l.arrive(3, versioned, any(), 1s); // queued
  l.stop_serving("rebuilding the engine");
  // Running requests are stopped in id order; the queued one is refused.
  EXPECT_EQ(names(l.activation_failed(2s)),
            (list{"stop 1", "stop 2", "fail 3 503 EngineUnavailable"}));
  EXPECT_EQ(names(l.engine_done(2, ok(), 3s)), (list{"fail 2 503 EngineUnavailable"}));
  EXPECT_EQ(names(l.engine_done(1, ok(), 3s)), (list{"fail 1 503 EngineUnavailable"}));
  EXPECT_EQ(l.unanswered(), 0u);
}

TEST(request_lifecycle, called_off_commit_reopens_on_the_old_version) {
  auto l = serving(5);
  l.arrive(1, versioned, exact_v(5), 0s);
  l.begin_commit(commit_mode::in_place, false, 1s);
  l.arrive(2, versioned, any(), 1s);
  EXPECT_EQ(names(l.commit_cancelled(2s)), (list{"start 2@5"}));
}

TEST(request_lifecycle, engine_error_maps_through_the_one_table) {
  auto l = serving(5);
  l.arrive(1, versioned, any(), 0s);
  l.arrive(2, versioned, any(), 0s);
  l.arrive(3, versioned, any(), 0s);
  EXPECT_EQ(names(l.engine_done(1, {false, error{errc::invalid_argument, "bad prompt"}}, 1s)),
            (list{"fail 1 400 BadRequest"}));
  EXPECT_EQ(names(l.engine_done(2, {false, error{errc::backend_failure, "socket closed"}}, 1s)),
            (list{"fail 2 500 EngineError"}));
  // A non-200 answer of the engine passes through unstamped.
  EXPECT_EQ(names(l.engine_done(3, {false, std::nullopt}, 1s)), (list{"deliver 3"}));
}

TEST(request_lifecycle, retiring_refuses_new_work_but_finishes_running) {
  auto l = serving(5);
  l.arrive(1, versioned, any(), 0s);
  l.retire();
  auto fx = l.arrive(2, versioned, any(), 1s);
  ASSERT_EQ(names(fx), (list{"fail 2 503 EngineUnavailable"}));
  EXPECT_TRUE(std::get<fx::fail>(fx[0]).error.retryable);
  EXPECT_EQ(names(l.engine_done(1, ok(), 2s)), (list{"deliver 1 [5,5]"}));
}

TEST(http_errors, every_failure_has_one_shape) {
  auto e =
    make_http_error(http_failure::route_blocked, "route /update_weights controls the engine");
  EXPECT_EQ(e.status, 403);
  EXPECT_EQ(e.type, "RouteBlocked");
  EXPECT_FALSE(e.retryable);
  EXPECT_EQ(e.retry_after, 0u);
  auto body = nlohmann::json::parse(e.body());
  EXPECT_EQ(body["type"], "RouteBlocked");
  EXPECT_EQ(body["message"], "route /update_weights controls the engine");
  EXPECT_EQ(body["retryable"], false);
  EXPECT_EQ(body["error"]["type"], "RouteBlocked");

  auto u = make_http_error(http_failure::unavailable, "not ready");
  EXPECT_EQ(u.status, 503);
  EXPECT_TRUE(u.retryable);
  EXPECT_EQ(u.retry_after, 1u);
}

TEST(http_errors, domain_errors_map_to_statuses) {
  EXPECT_EQ(http_error_of(error{errc::invalid_argument, "x"}).status, 400);
  EXPECT_EQ(http_error_of(error{errc::limit_exceeded, "x"}).status, 400);
  EXPECT_EQ(http_error_of(error{errc::not_found, "x"}).status, 404);
  EXPECT_EQ(http_error_of(error{errc::engine_unavailable, "x"}).status, 503);
  EXPECT_EQ(http_error_of(error{errc::no_run_claimed, "x"}).status, 503);
  // A full queue is no bad request: asked again after a moment, it may pass.
  auto busy = http_error_of(error{errc::busy, "the store's fast lane is full"});
  EXPECT_EQ(busy.status, 503);
  EXPECT_TRUE(busy.retryable);
  EXPECT_EQ(busy.retry_after, 1u);
  EXPECT_EQ(busy.message, "the store's fast lane is full");
  EXPECT_EQ(http_error_of(error{errc::drain_timeout, "x"}).type, "DrainTimeout");
  auto conflict = http_error_of(error{errc::version_not_ready, "x"});
  EXPECT_EQ(conflict.status, 409);
  EXPECT_EQ(conflict.type, "WeightVersionNotReady");
  EXPECT_EQ(http_error_of(error{errc::backend_failure, "x"}).status, 500);
}

TEST(http_errors, a_client_reads_the_domain_error_back_from_an_answer) {
  // Round trip for every kind an answer keeps apart.
  for (auto code : {errc::invalid_argument, errc::unauthorized, errc::route_blocked,
                    errc::not_found, errc::version_not_ready, errc::engine_unavailable,
                    errc::drain_timeout, errc::version_exists, errc::rewind, errc::conflict}) {
    auto answer = http_error_of(error{code, "x"});
    EXPECT_EQ(errc_of_http_answer(answer.status, answer.type), code) << answer.type;
  }
  EXPECT_EQ(errc_of_http_answer(413, "PayloadTooLarge"), errc::limit_exceeded);
  // Types that are not ours: by status.
  EXPECT_EQ(errc_of_http_answer(503, "Overloaded"), errc::engine_unavailable);
  EXPECT_EQ(errc_of_http_answer(422, ""), errc::invalid_argument);
  EXPECT_EQ(errc_of_http_answer(500, "EngineError"), errc::backend_failure);
  EXPECT_EQ(errc_of_http_answer(502, ""), errc::backend_failure);
}

} // namespace
} // namespace stitch
