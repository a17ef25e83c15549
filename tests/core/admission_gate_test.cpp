#include <gtest/gtest.h>

#include "core/constraint_helpers.hpp"

#include "runtime/core/admission_gate.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using namespace stitch::testing;
namespace ge = gate_effects;

admission_gate serving(uint64_t version, clock_time drain_timeout = 300s) {
  admission_gate g{admission_gate::options{drain_timeout, 4096}};
  g.serve(version);
  return g;
}

bool proceeds(const std::vector<gate_effect>& fx) {
  return std::any_of(fx.begin(), fx.end(), [](const gate_effect& e) {
    return std::holds_alternative<ge::commit_may_proceed>(e);
  });
}

TEST(admission_gate, nothing_served_is_unavailable_with_reason) {
  admission_gate g;
  g.stop_serving("no run claimed");
  auto a = g.admit(1, any(), 0s);
  ASSERT_TRUE(std::holds_alternative<unavailable>(a));
  EXPECT_EQ(std::get<unavailable>(a).reason, "no run claimed");
  EXPECT_EQ(g.active_requests(), 0u);
}

TEST(admission_gate, taken_out_refuses_new_and_queued_requests_until_put_back) {
  auto g = serving(5);
  ASSERT_TRUE(std::holds_alternative<admitted>(g.admit(1, any(), 0s)));
  // An exact pin holds the commit: request 2 queues behind it.
  ASSERT_TRUE(std::holds_alternative<admitted>(g.admit(2, exact_v(5), 0s)));
  EXPECT_FALSE(proceeds(g.begin_commit(commit_mode::in_place, false, 1s)));
  ASSERT_TRUE(std::holds_alternative<queued>(g.admit(3, any(), 1s)));
  g.take_out("out of rotation: profiling");
  EXPECT_TRUE(g.taken_out());
  auto late = g.admit(4, any(), 1s);
  ASSERT_TRUE(std::holds_alternative<unavailable>(late));
  EXPECT_EQ(std::get<unavailable>(late).reason, "out of rotation: profiling");
  EXPECT_TRUE(proceeds(g.finish(2, 2s).second));
  // The activation still lands and records the version; nobody is admitted.
  auto reopened = g.end_commit(6, 2s);
  ASSERT_EQ(reopened.size(), 1u);
  auto* refused = std::get_if<ge::refuse>(&reopened[0]);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->id, 3u);
  EXPECT_EQ(g.served_version(), 6u);
  EXPECT_TRUE(std::holds_alternative<unavailable>(g.admit(5, any(), 3s)));
  g.put_back();
  auto back = g.admit(6, any(), 3s);
  ASSERT_TRUE(std::holds_alternative<admitted>(back));
  EXPECT_EQ(std::get<admitted>(back).start_version, 6u);
}

TEST(admission_gate, admits_satisfied_constraints_at_served_version) {
  auto g = serving(5);
  auto a = g.admit(1, min_v(4), 0s);
  ASSERT_TRUE(std::holds_alternative<admitted>(a));
  EXPECT_EQ(std::get<admitted>(a).start_version, 5u);
  EXPECT_TRUE(std::holds_alternative<admitted>(g.admit(2, exact_v(5), 0s)));
  EXPECT_TRUE(std::holds_alternative<admitted>(g.admit(3, any(), 0s)));
  EXPECT_EQ(g.active_requests(), 3u);
  EXPECT_EQ(g.exact_pins(), 1u);
}

TEST(admission_gate, unsatisfied_floor_is_a_retryable_409) {
  auto g = serving(5);
  auto a = g.admit(1, min_v(7), 0s);
  ASSERT_TRUE(std::holds_alternative<rejected>(a));
  const auto& body = std::get<rejected>(a).body;
  EXPECT_EQ(body.target_version, 7u);
  EXPECT_EQ(body.applied, 5u);
  EXPECT_TRUE(body.retryable);
  EXPECT_EQ(g.active_requests(), 0u);
  EXPECT_EQ(g.metrics().rejected_total, 1u);
}

TEST(admission_gate, exact_pin_behind_applied_is_not_retryable) {
  auto g = serving(5);
  auto a = g.admit(1, exact_v(3), 0s);
  ASSERT_TRUE(std::holds_alternative<rejected>(a));
  EXPECT_FALSE(std::get<rejected>(a).body.retryable);
  auto ahead = g.admit(2, exact_v(6), 0s);
  ASSERT_TRUE(std::holds_alternative<rejected>(ahead));
  EXPECT_TRUE(std::get<rejected>(ahead).body.retryable);
}

TEST(admission_gate, finish_reports_start_and_end_stamps) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  auto [s, fx] = g.finish(1, 1s);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (stamps{5, 5}));
  EXPECT_TRUE(fx.empty());
  EXPECT_FALSE(g.finish(1, 1s).first) << "a request finishes once";
}

TEST(admission_gate, quiesce_closes_admission_then_waits_for_everyone) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  (void) g.admit(2, exact_v(5), 0s);
  auto fx = g.begin_commit(commit_mode::quiesce, false, 1s);
  EXPECT_TRUE(fx.empty());
  EXPECT_FALSE(g.open());
  EXPECT_EQ(g.holders(), 2u);
  // Admission is closed before the drain: a newcomer queues.
  EXPECT_TRUE(std::holds_alternative<queued>(g.admit(3, any(), 1s)));
  EXPECT_TRUE(g.finish(2, 2s).second.empty());
  auto last = g.finish(1, 3s).second;
  ASSERT_EQ(last.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<ge::commit_may_proceed>(last[0]));
  EXPECT_EQ(std::get<ge::commit_may_proceed>(last[0]).drain, 2s);
}

TEST(admission_gate, in_place_waits_only_for_exact_pins) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  (void) g.admit(2, min_v(3), 0s);
  (void) g.admit(3, exact_v(5), 0s);
  EXPECT_TRUE(g.begin_commit(commit_mode::in_place, false, 1s).empty());
  EXPECT_EQ(g.holders(), 1u);
  EXPECT_TRUE(proceeds(g.finish(3, 2s).second));
  EXPECT_EQ(g.active_requests(), 2u) << "non-exact requests keep running";
}

TEST(admission_gate, in_place_without_pins_proceeds_at_once) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  EXPECT_TRUE(proceeds(g.begin_commit(commit_mode::in_place, false, 1s)));
}

TEST(admission_gate, request_crossing_in_place_commit_has_differing_stamps) {
  auto g = serving(5);
  (void) g.admit(1, min_v(5), 0s);
  ASSERT_TRUE(proceeds(g.begin_commit(commit_mode::in_place, false, 1s)));
  (void) g.end_commit(6, 1s + 300us);
  auto [s, fx] = g.finish(1, 2s);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (stamps{5, 6}));
  EXPECT_EQ(g.metrics().last_pause, 300us);
}

TEST(admission_gate, run_switch_drain_all_waits_for_everyone_even_in_place) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  EXPECT_TRUE(g.begin_commit(commit_mode::in_place, true, 1s).empty());
  EXPECT_EQ(g.holders(), 1u);
  EXPECT_TRUE(proceeds(g.finish(1, 2s).second));
}

TEST(admission_gate, queued_requests_are_decided_on_reopen_against_new_version) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  (void) g.begin_commit(commit_mode::quiesce, false, 0s);
  EXPECT_TRUE(std::holds_alternative<queued>(g.admit(2, min_v(6), 0s)));
  EXPECT_TRUE(std::holds_alternative<queued>(g.admit(3, exact_v(5), 0s)));
  EXPECT_TRUE(std::holds_alternative<queued>(g.admit(4, any(), 0s)));
  ASSERT_TRUE(proceeds(g.finish(1, 1s).second));
  auto fx = g.end_commit(6, 2s);
  ASSERT_EQ(fx.size(), 3u);
  ASSERT_TRUE(std::holds_alternative<ge::admit>(fx[0]));
  EXPECT_EQ(std::get<ge::admit>(fx[0]).id, 2u);
  EXPECT_EQ(std::get<ge::admit>(fx[0]).start_version, 6u);
  ASSERT_TRUE(std::holds_alternative<ge::reject>(fx[1]));
  EXPECT_EQ(std::get<ge::reject>(fx[1]).id, 3u);
  EXPECT_FALSE(std::get<ge::reject>(fx[1]).body.retryable);
  ASSERT_TRUE(std::holds_alternative<ge::admit>(fx[2]));
  EXPECT_TRUE(g.open());
  EXPECT_EQ(g.active_requests(), 2u);
  EXPECT_EQ(g.metrics().commits_total, 1u);
}

TEST(admission_gate, cancelled_queued_request_is_dropped) {
  auto g = serving(5);
  (void) g.begin_commit(commit_mode::quiesce, false, 0s);
  (void) g.admit(7, any(), 0s);
  EXPECT_EQ(g.queued_requests(), 1u);
  EXPECT_FALSE(g.finish(7, 0s).first);
  EXPECT_EQ(g.queued_requests(), 0u);
  EXPECT_TRUE(g.end_commit(6, 1s).empty());
}

TEST(admission_gate, exact_pin_outliving_deadline_is_aborted_with_drain_timeout) {
  auto g = serving(5, 10s);
  (void) g.admit(1, exact_v(5), 0s);
  (void) g.admit(2, any(), 0s);
  EXPECT_TRUE(g.begin_commit(commit_mode::in_place, false, 1s).empty());
  EXPECT_EQ(g.drain_deadline(), std::optional<clock_time>{11s});
  EXPECT_TRUE(g.tick(10s).empty()) << "not yet";
  auto fx = g.tick(11s);
  ASSERT_EQ(fx.size(), 2u);
  ASSERT_TRUE(std::holds_alternative<ge::abort_request>(fx[0]));
  EXPECT_EQ(std::get<ge::abort_request>(fx[0]).id, 1u);
  ASSERT_TRUE(std::holds_alternative<ge::commit_may_proceed>(fx[1]));
  EXPECT_EQ(std::get<ge::commit_may_proceed>(fx[1]).drain, 10s);
  EXPECT_EQ(g.exact_pins(), 0u);
  EXPECT_EQ(g.active_requests(), 1u);
  EXPECT_EQ(g.metrics().drain_timeouts_total, 1u);
  EXPECT_FALSE(g.finish(1, 12s).first) << "the aborted request is gone";
}

TEST(admission_gate, drain_and_pause_are_measured_apart) {
  auto g = serving(1);
  (void) g.admit(1, any(), 0s);
  (void) g.begin_commit(commit_mode::quiesce, false, 10s);
  ASSERT_TRUE(proceeds(g.finish(1, 13s).second));
  (void) g.end_commit(2, 13s + 2ms);
  EXPECT_EQ(g.metrics().last_drain, 3s);
  EXPECT_EQ(g.metrics().last_pause, 2ms);
  EXPECT_EQ(g.metrics().max_pause, 2ms);
}

TEST(admission_gate, aborted_commit_reopens_on_old_version) {
  auto g = serving(5);
  (void) g.begin_commit(commit_mode::quiesce, false, 0s);
  (void) g.admit(1, any(), 0s);
  auto fx = g.abort_commit(1s);
  ASSERT_EQ(fx.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<ge::admit>(fx[0]));
  EXPECT_EQ(std::get<ge::admit>(fx[0]).start_version, 5u);
  EXPECT_EQ(g.served_version(), 5u);
}

TEST(admission_gate, advance_flips_without_commit_but_not_during_one) {
  auto g = serving(5);
  (void) g.admit(1, any(), 0s);
  ASSERT_TRUE(g.advance(7));
  EXPECT_EQ(g.finish(1, 1s).first, (stamps{5, 7}));
  (void) g.begin_commit(commit_mode::quiesce, false, 1s);
  EXPECT_FALSE(g.advance(8));
}

TEST(admission_gate, an_exact_pin_keeps_its_stamps_across_an_advance_of_identical_weights) {
  // Found by the loopback cluster test: a trainer whose step changed nothing
  // publishes an empty delta; the replica advances without an activation
  // while an exact pin runs, and the pin must still report start = end.
  auto g = serving(5);
  ASSERT_TRUE(std::holds_alternative<admitted>(g.admit(1, exact_v(5), 0s)));
  ASSERT_TRUE(std::holds_alternative<admitted>(g.admit(2, min_v(5), 0s)));
  ASSERT_TRUE(g.advance(6));
  EXPECT_EQ(g.finish(1, 1s).first, (stamps{5, 5}));
  EXPECT_EQ(g.finish(2, 1s).first, (stamps{5, 6}));
}

TEST(admission_gate, full_queue_refuses_newcomers) {
  admission_gate g{admission_gate::options{300s, 2}};
  g.serve(1);
  (void) g.begin_commit(commit_mode::quiesce, false, 0s);
  (void) g.admit(1, any(), 0s);
  (void) g.admit(2, any(), 0s);
  EXPECT_TRUE(std::holds_alternative<unavailable>(g.admit(3, any(), 0s)));
}

TEST(admission_gate, commit_modes_parse_and_print) {
  EXPECT_EQ(*parse_commit_mode("quiesce"), commit_mode::quiesce);
  EXPECT_EQ(*parse_commit_mode("in_place"), commit_mode::in_place);
  EXPECT_EQ(to_string(commit_mode::in_place), "in_place");
  auto bad = parse_commit_mode("inplace");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("inplace"), std::string::npos);
}

} // namespace
} // namespace stitch
