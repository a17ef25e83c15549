#include <gtest/gtest.h>

#include "runtime/core/cluster_plan.hpp"

namespace stitch {
namespace {

member_info replica_node(std::string name, std::vector<uint32_t> slots) {
  return {std::move(name), {"replica"}, std::move(slots), {}};
}

experiment_spec spec(std::string run, uint32_t replicas, bool trainer = false) {
  experiment_spec s;
  s.run_id = std::move(run);
  s.replicas = replicas;
  s.trainer.enabled = trainer;
  return s;
}

size_t count(const std::vector<plan_effect>& fx, plan_effect::kind k) {
  return static_cast<size_t>(
    std::count_if(fx.begin(), fx.end(), [&](const plan_effect& e) { return e.what == k; }));
}

TEST(cluster_plan, places_replicas_spread_over_the_freest_nodes) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1})));
  ASSERT_TRUE(plan.join(replica_node("b", {0, 1})));
  auto fx = plan.submit(spec("run1", 2));
  ASSERT_TRUE(fx) << fx.error().message;
  ASSERT_EQ(fx->size(), 2u);
  EXPECT_EQ((*fx)[0].what, plan_effect::kind::place_replica);
  EXPECT_NE((*fx)[0].replica.node, (*fx)[1].replica.node);
  EXPECT_EQ((*fx)[0].replica.pool, "default");
  EXPECT_EQ(plan.free_slots(), 2u);
}

TEST(cluster_plan, refuses_what_cannot_be_placed_with_the_reason) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  auto too_many = plan.submit(spec("run1", 2));
  ASSERT_FALSE(too_many);
  EXPECT_NE(too_many.error().message.find("1 replica slots are free"), std::string::npos);
  auto no_trainer = plan.submit(spec("run1", 1, true));
  ASSERT_FALSE(no_trainer);
  EXPECT_NE(no_trainer.error().message.find("trainer"), std::string::npos);
  auto bad = spec("../etc", 0);
  bad.commit_mode = "sometimes";
  auto invalid = plan.submit(bad);
  ASSERT_FALSE(invalid);
  EXPECT_EQ(invalid.error().code, errc::invalid_argument);
  EXPECT_NE(invalid.error().message.find("run_id"), std::string::npos);
  EXPECT_NE(invalid.error().message.find("replicas"), std::string::npos);
  EXPECT_NE(invalid.error().message.find("commit_mode"), std::string::npos);
  // Nothing was admitted by the refusals.
  EXPECT_TRUE(plan.experiments().empty());
  EXPECT_EQ(plan.free_slots(), 1u);
}

TEST(cluster_plan, one_active_experiment_per_pool_and_unique_runs) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1, 2})));
  ASSERT_TRUE(plan.submit(spec("run1", 1)));
  auto same_pool = plan.submit(spec("run2", 1));
  ASSERT_FALSE(same_pool);
  EXPECT_NE(same_pool.error().message.find("stitch stop run1"), std::string::npos);
  auto other = spec("run2", 1);
  other.pool = "other";
  EXPECT_TRUE(plan.submit(other));
  auto again = spec("run2", 1);
  again.pool = "third";
  EXPECT_FALSE(plan.submit(again));
}

TEST(cluster_plan, a_node_that_dies_has_its_replicas_placed_elsewhere_or_later) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  ASSERT_TRUE(plan.join(replica_node("b", {0})));
  ASSERT_TRUE(plan.submit(spec("run1", 2)));
  auto fx = plan.leave("b");
  EXPECT_TRUE(fx.empty()); // a is full: the replica waits
  ASSERT_EQ(plan.experiments().size(), 1u);
  EXPECT_EQ(plan.experiments()[0].replicas.size(), 1u);
  EXPECT_NE(plan.experiments()[0].shortfall.find("1 replica(s) waiting"), std::string::npos);
  // b comes back: the missing replica is placed on it, under a new id.
  auto back = plan.join(replica_node("b", {0}));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].replica.node, "b");
  EXPECT_EQ((*back)[0].replica.replica_id, "run1-r2");
  EXPECT_TRUE(plan.experiments()[0].shortfall.empty());
}

TEST(cluster_plan, a_live_name_cannot_join_twice) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  auto twice = plan.join(replica_node("a", {1}));
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code, errc::conflict);
  EXPECT_FALSE(plan.join(replica_node("a b", {1})));
}

TEST(cluster_plan, scale_up_places_and_scale_down_retires_newest_first_then_frees_slots) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1, 2})));
  ASSERT_TRUE(plan.submit(spec("run1", 1)));
  auto up = plan.scale("", 3);
  ASSERT_TRUE(up);
  EXPECT_EQ(count(*up, plan_effect::kind::place_replica), 2u);
  EXPECT_FALSE(plan.scale("", 4)); // only 3 slots
  auto down = plan.scale("run1", 1);
  ASSERT_TRUE(down);
  ASSERT_EQ(down->size(), 2u);
  EXPECT_EQ((*down)[0].what, plan_effect::kind::retire_replica);
  EXPECT_EQ((*down)[0].replica.replica_id, "run1-r2");
  EXPECT_EQ((*down)[1].replica.replica_id, "run1-r1");
  // Draining replicas keep their slots until they are gone.
  EXPECT_EQ(plan.free_slots(), 0u);
  EXPECT_TRUE(plan.retired("run1-r2").empty());
  EXPECT_EQ(plan.free_slots(), 1u);
  EXPECT_EQ(plan.experiments()[0].replicas.size(), 1u);
  EXPECT_EQ(plan.experiments()[0].replicas[0].replica_id, "run1-r0");
}

TEST(cluster_plan, a_trainer_needs_a_gateway_to_sample_through) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  ASSERT_TRUE(plan.join({"t", {"trainer"}, {}, {}}));
  auto refused = plan.submit(spec("run1", 1, true));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("'gateway'"), std::string::npos);
  EXPECT_TRUE(plan.submit(spec("run1", 1, false))); // no trainer: no gateway needed
  ASSERT_TRUE(plan.stop("run1"));
  plan.retired("run1-r0");
  ASSERT_TRUE(plan.join({"g", {"gateway"}, {}, "127.0.0.1:8080"}));
  EXPECT_TRUE(plan.submit(spec("run2", 1, true)));
  // The gateway node dies, and the trainer's node with it: the trainer
  // waits for a gateway (and is not given up), and starts when one joins.
  EXPECT_TRUE(plan.leave("g").empty());
  auto lost = plan.leave("t");
  EXPECT_EQ(count(lost, plan_effect::kind::start_trainer), 0u);
  auto back = plan.join({"t", {"trainer"}, {}, {}});
  ASSERT_TRUE(back);
  EXPECT_EQ(count(*back, plan_effect::kind::start_trainer), 0u);
  EXPECT_NE(plan.experiments()[0].shortfall.find("'gateway'"), std::string::npos)
    << plan.experiments()[0].shortfall;
  auto gw = plan.join({"g", {"gateway"}, {}, "127.0.0.1:8080"});
  ASSERT_TRUE(gw);
  ASSERT_EQ(count(*gw, plan_effect::kind::start_trainer), 1u);
  EXPECT_EQ(plan.experiments()[0].trainer_node, "t");
}

TEST(cluster_plan, stop_retires_every_replica_and_the_trainer) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1})));
  ASSERT_TRUE(plan.join({"t", {"trainer", "gateway"}, {}, {}}));
  auto fx = plan.submit(spec("run1", 2, true));
  ASSERT_TRUE(fx);
  EXPECT_EQ(count(*fx, plan_effect::kind::start_trainer), 1u);
  auto stopped = plan.stop("run1");
  ASSERT_TRUE(stopped);
  EXPECT_EQ(count(*stopped, plan_effect::kind::retire_replica), 2u);
  EXPECT_EQ(count(*stopped, plan_effect::kind::stop_trainer), 1u);
  EXPECT_TRUE(plan.experiments().empty());
  EXPECT_FALSE(plan.stop("run1"));
  // The pool is free again once stopped.
  EXPECT_FALSE(plan.submit(spec("run2", 1))); // slots still draining
  plan.retired("run1-r0");
  EXPECT_TRUE(plan.submit(spec("run2", 1)));
}

TEST(cluster_plan, a_trainer_that_lost_its_node_is_restarted_on_another) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  ASSERT_TRUE(plan.join({"g", {"gateway"}, {}, {}}));
  ASSERT_TRUE(plan.join({"t1", {"trainer"}, {}, {}}));
  ASSERT_TRUE(plan.submit(spec("run1", 1, true)));
  EXPECT_EQ(plan.experiments()[0].trainer_node, "t1");
  EXPECT_TRUE(plan.leave("t1").empty());
  EXPECT_NE(plan.experiments()[0].shortfall.find("trainer waiting"), std::string::npos);
  auto fx = plan.join({"t2", {"trainer"}, {}, {}});
  ASSERT_TRUE(fx);
  ASSERT_EQ(fx->size(), 1u);
  EXPECT_EQ((*fx)[0].what, plan_effect::kind::start_trainer);
  EXPECT_EQ((*fx)[0].node, "t2");
  // A finished trainer is not restarted.
  plan.trainer_ended("run1");
  EXPECT_TRUE(plan.leave("t2").empty());
}

TEST(cluster_plan, a_replica_that_failed_to_start_is_placed_again) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  ASSERT_TRUE(plan.join(replica_node("b", {0})));
  auto fx = plan.submit(spec("run1", 1));
  ASSERT_TRUE(fx);
  auto again = plan.replica_lost((*fx)[0].replica.replica_id);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].what, plan_effect::kind::place_replica);
  EXPECT_NE(again[0].replica.replica_id, (*fx)[0].replica.replica_id);
}

TEST(cluster_plan, scale_and_stop_need_a_run_when_several_are_active) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1})));
  EXPECT_FALSE(plan.scale("", 2));
  ASSERT_TRUE(plan.submit(spec("run1", 1)));
  auto other = spec("run2", 1);
  other.pool = "p2";
  ASSERT_TRUE(plan.submit(other));
  auto ambiguous = plan.scale("", 2);
  ASSERT_FALSE(ambiguous);
  EXPECT_NE(ambiguous.error().message.find("--run"), std::string::npos);
  EXPECT_FALSE(plan.scale("run1", 0));
  EXPECT_FALSE(plan.stop("nope"));
}

TEST(cluster_plan, the_spec_of_a_run_follows_scale_and_ignores_a_refused_resubmit) {
  cluster_plan plan;
  ASSERT_TRUE(plan.join(replica_node("a", {0, 1, 2})));
  ASSERT_TRUE(plan.submit(spec("run1", 1)));
  auto again = spec("run1", 3);
  again.commit_mode = "quiesce";
  EXPECT_FALSE(plan.submit(again));
  ASSERT_NE(plan.spec_of("run1"), nullptr);
  EXPECT_EQ(plan.spec_of("run1")->commit_mode, "in_place");
  ASSERT_TRUE(plan.scale("run1", 2));
  EXPECT_EQ(plan.spec_of("run1")->replicas, 2u);
  ASSERT_TRUE(plan.stop("run1"));
  EXPECT_EQ(plan.spec_of("run1"), nullptr);
}

TEST(cluster_plan, a_restarted_coordinator_adopts_what_kept_running_and_fills_the_rest_later) {
  // Before the restart: two replicas on a and b, a trainer on t.
  cluster_plan before;
  ASSERT_TRUE(before.join(replica_node("a", {0, 1})));
  ASSERT_TRUE(before.join(replica_node("b", {0})));
  ASSERT_TRUE(before.join({"t", {"trainer", "gateway"}, {}, "127.0.0.1:8080"}));
  auto s = spec("run1", 3, true);
  s.pool = "p1";
  ASSERT_TRUE(before.submit(s));
  std::vector<placement> on_a, on_b;
  for (const auto& [id, p] : before.placements())
    (p.node == "a" ? on_a : on_b).push_back(p);
  ASSERT_EQ(on_a.size() + on_b.size(), 3u);
  ASSERT_FALSE(on_b.empty());

  cluster_plan after;
  ASSERT_TRUE(after.restore(before.records()));
  EXPECT_TRUE(after.recovering());
  ASSERT_EQ(after.experiments().size(), 1u);
  EXPECT_EQ(after.experiments()[0].spec.replicas, 3u);
  EXPECT_NE(after.experiments()[0].shortfall.find("recovering"), std::string::npos);

  // a rejoins with its replicas and one of another run: its own are adopted
  // where they run, the stranger retired; nothing new is placed yet.
  member_holdings held{on_a, {}};
  placement stranger{"other-r0", "other", "p9", "a", 1, false};
  held.replicas.push_back(stranger);
  auto fx = after.join(replica_node("a", {0, 1, 2}), held);
  ASSERT_TRUE(fx);
  EXPECT_EQ(count(*fx, plan_effect::kind::adopt_replica), on_a.size());
  EXPECT_EQ(count(*fx, plan_effect::kind::place_replica), 0u);
  ASSERT_EQ(count(*fx, plan_effect::kind::retire_replica), 1u);
  for (const auto& e : *fx)
    if (e.what == plan_effect::kind::retire_replica)
      EXPECT_EQ(e.replica.replica_id, "other-r0");
    else
      EXPECT_EQ(after.placements().at(e.replica.replica_id).slot, e.replica.slot);

  // The trainer node reports its trainer: adopted, not started again.
  auto t = after.join({"t", {"trainer", "gateway"}, {}, "127.0.0.1:8080"}, {{}, {"run1"}});
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->empty());
  EXPECT_EQ(after.experiments()[0].trainer_node, "t");

  // The window ends before b is back: the missing replica is placed on a
  // free slot with a fresh name.
  auto rest = after.end_recovery();
  EXPECT_FALSE(after.recovering());
  ASSERT_EQ(count(rest, plan_effect::kind::place_replica), on_b.size());
  EXPECT_EQ(count(rest, plan_effect::kind::start_trainer), 0u);
  for (const auto& e : rest) {
    EXPECT_EQ(e.replica.node, "a");
    for (const auto& [id, p] : before.placements())
      EXPECT_NE(e.replica.replica_id, id) << "a replica name was given twice";
  }

  // b comes back late with its replica: the run has all it wants, so it is retired.
  auto late = after.join(replica_node("b", {0}), {on_b, {}});
  ASSERT_TRUE(late);
  EXPECT_EQ(count(*late, plan_effect::kind::retire_replica), on_b.size());
  EXPECT_EQ(count(*late, plan_effect::kind::adopt_replica), 0u);
}

TEST(cluster_plan, adoption_refuses_wrong_pools_slots_and_second_trainers) {
  cluster_plan plan;
  ASSERT_TRUE(plan.restore({{spec("run1", 2, true), false, 3}}));
  ASSERT_TRUE(plan.join({"g", {"gateway", "trainer"}, {}, "127.0.0.1:8080"}, {{}, {"run1"}}));
  ASSERT_EQ(plan.experiments()[0].trainer_node, "g");
  member_holdings held;
  held.replicas.push_back({"run1-r7", "run1", "elsewhere", "x", 1, false}); // wrong pool
  held.replicas.push_back({"run1-r8", "run1", "default", "x", 5, false});   // no such slot
  held.replicas.push_back({"run1-r9", "run1", "default", "x", 1, false});   // fits
  held.trainers = {"run1", "gone"};
  auto fx = plan.join(replica_node("b", {0, 1}), held);
  ASSERT_TRUE(fx);
  EXPECT_EQ(count(*fx, plan_effect::kind::retire_replica), 2u);
  EXPECT_EQ(count(*fx, plan_effect::kind::adopt_replica), 1u);
  EXPECT_EQ(count(*fx, plan_effect::kind::stop_trainer), 2u);
  EXPECT_EQ(plan.experiments()[0].trainer_node, "g");
  EXPECT_EQ(plan.placements().at("run1-r9").node, "b");
  // The stray trainer stopped on b does not end the run's.
  EXPECT_FALSE(plan.trainer_ended("run1", "b"));
  EXPECT_EQ(plan.experiments()[0].shortfall.find("trainer"), std::string::npos);
  // The counter passed the adopted name: the next replica is run1-r10.
  auto rest = plan.end_recovery();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].replica.replica_id, "run1-r10");
}

TEST(cluster_plan, restore_refuses_records_that_cannot_be_and_a_plan_in_use) {
  cluster_plan plan;
  auto a = spec("run1", 1);
  auto b = spec("run2", 1); // the same pool, "default"
  EXPECT_FALSE(plan.restore({{a, false, 0}, {b, false, 0}}));
  auto bad = spec("../x", 1);
  auto refused = plan.restore({{bad, false, 0}});
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("run_id"), std::string::npos);
  EXPECT_TRUE(plan.experiments().empty());
  ASSERT_TRUE(plan.join(replica_node("a", {0})));
  ASSERT_TRUE(plan.submit(a));
  EXPECT_FALSE(plan.restore({{b, false, 0}}));
  // Nothing restored: no recovery window.
  cluster_plan empty;
  ASSERT_TRUE(empty.restore({}));
  EXPECT_FALSE(empty.recovering());
}

} // namespace
} // namespace stitch
