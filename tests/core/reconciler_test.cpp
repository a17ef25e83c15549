#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>

#include "runtime/core/reconciler.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
namespace fx = reconcile_effects;

/// Drives a reconciler against an in-memory store and engine, completing each
/// effect in order and logging every step, so tests assert the exact sequence.
class driver {
public:
  std::optional<pointer_record> pointer;
  std::map<version_ref, manifest> manifests;
  bool fail_stage = false;
  bool fail_commit = false;
  bool fail_pointer = false;
  bool fail_rebuild = false;
  /// Called with each effect before it completes (to inject events mid-pass).
  std::function<void(const reconcile_effect&)> before;
  std::vector<std::string> log;
  reconciler r;

  void full(const std::string& run, uint64_t v) {
    manifest m;
    m.ref = {run, v};
    m.kind = version_kind::full;
    m.weight_map = {{"w", "model-00001-of-00001.safetensors"}};
    m.touched = {"w"};
    manifests[m.ref] = m;
  }
  void delta(const std::string& run, uint64_t v, bool empty = false) {
    manifest m;
    m.ref = {run, v};
    m.kind = version_kind::delta;
    m.base_version = v - 1;
    m.encoding = delta_encoding::xor_bytes;
    if (!empty) {
      m.weight_map = {{"w", "model-00001-of-00001.safetensors"}};
      m.touched = {"w"};
    }
    manifests[m.ref] = m;
  }
  void point(const std::string& run, uint64_t v, uint64_t boot = 0) {
    pointer = pointer_record{{run, v}, boot};
  }
  /// Publishes a full anchor at 0 and deltas 1..n, pointer at n.
  void chain(const std::string& run, uint64_t n) {
    full(run, 0);
    for (uint64_t v = 1; v <= n; ++v)
      delta(run, v);
    point(run, n);
  }

  void trigger(stitch::trigger why = trigger::wake) { run(r.on_trigger(why)); }

  void run(std::vector<reconcile_effect> effects) {
    std::deque<reconcile_effect> queue(effects.begin(), effects.end());
    while (!queue.empty()) {
      auto e = std::move(queue.front());
      queue.pop_front();
      if (before)
        before(e);
      auto more = complete(e);
      queue.insert(queue.end(), more.begin(), more.end());
    }
  }

  size_t count(const std::string& prefix) const {
    return static_cast<size_t>(std::count_if(
      log.begin(), log.end(), [&](const std::string& l) { return l.rfind(prefix, 0) == 0; }));
  }

private:
  std::vector<reconcile_effect> complete(const reconcile_effect& e) {
    if (auto* p = std::get_if<fx::read_pointer>(&e)) {
      log.push_back("read_pointer");
      if (fail_pointer)
        return r.on_pointer_read(p->op, make_error(errc::backend_failure, "store down"));
      return r.on_pointer_read(p->op, pointer);
    }
    if (auto* m = std::get_if<fx::read_manifest>(&e)) {
      log.push_back("read_manifest " + to_string(m->ref));
      if (auto it = manifests.find(m->ref); it != manifests.end())
        return r.on_manifest_read(m->op, m->ref, it->second);
      return r.on_manifest_read(m->op, m->ref, make_error(errc::not_found, "no such version"));
    }
    if (auto* s = std::get_if<fx::stage>(&e)) {
      std::string line = "stage " + to_string(s->plan.target) + " folding "
                         + std::to_string(s->plan.folded_versions());
      if (s->plan.anchor)
        line += " from " + to_string(*s->plan.anchor);
      if (s->onto_shadow)
        line += " onto shadow";
      log.push_back(line);
      if (fail_stage)
        return r.on_staged(s->op, make_error(errc::checksum_mismatch, "tensor 'w'"), 2s);
      return r.on_staged(s->op, {}, 2s);
    }
    if (auto* c = std::get_if<fx::commit>(&e)) {
      log.push_back("commit " + to_string(c->target) + (c->drain_all ? " drain_all" : "")
                    + (c->flush_cache ? " flush" : ""));
      if (fail_commit)
        return r.on_committed(c->op, make_error(errc::activation_failed, "engine crashed"), 1ms);
      return r.on_committed(c->op, {}, 1ms);
    }
    if (auto* a = std::get_if<fx::advance>(&e)) {
      log.push_back("advance " + to_string(a->target));
      return {};
    }
    if (std::holds_alternative<fx::discard_shadow>(e)) {
      log.push_back("discard_shadow");
      return {};
    }
    if (auto* b = std::get_if<fx::rebuild_engine>(&e)) {
      log.push_back("rebuild " + (b->last_good ? to_string(*b->last_good) : std::string{"-"}));
      if (fail_rebuild)
        return r.on_rebuilt(b->op, make_error(errc::backend_failure, "no bytes"));
      return r.on_rebuilt(b->op, b->last_good ? *b->last_good : pointer->latest);
    }
    if (auto* l = std::get_if<fx::leave_rotation>(&e)) {
      log.push_back("leave " + l->reason);
      return {};
    }
    if (auto* n = std::get_if<fx::enter_rotation>(&e)) {
      log.push_back("enter " + to_string(n->version));
      return {};
    }
    return {};
  }
};

using lines = std::vector<std::string>;

TEST(reconciler, fresh_replica_catches_up_and_only_then_is_ready) {
  driver d;
  d.full("r", 0);
  d.point("r", 0);
  EXPECT_FALSE(d.r.ready());
  d.before = [&](const reconcile_effect& e) {
    if (!std::holds_alternative<fx::enter_rotation>(e)) {
      EXPECT_FALSE(d.r.ready()) << "ready before the first catch-up completed";
    }
  };
  d.trigger(trigger::startup);
  EXPECT_EQ(d.log, (lines{"read_pointer", "read_manifest r/weight_v000000",
                          "stage r/weight_v000000 folding 1 from r/weight_v000000", "read_pointer",
                          "commit r/weight_v000000", "enter r/weight_v000000"}));
  EXPECT_TRUE(d.r.ready());
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 0}));
  EXPECT_EQ(d.r.state(), sync_state::idle);
}

TEST(reconciler, retargeting_starts_cold_in_the_other_pool_and_switches_runs_back) {
  driver d;
  d.chain("home", 2);
  d.trigger(trigger::startup);
  ASSERT_TRUE(d.r.ready());
  // Refused during a pass.
  auto pass = d.r.on_trigger(trigger::wake);
  EXPECT_FALSE(d.r.retarget(true));
  d.run(std::move(pass));
  ASSERT_TRUE(d.r.retarget(true));
  EXPECT_FALSE(d.r.ready());
  EXPECT_FALSE(d.r.applied());
  EXPECT_FALSE(d.r.snapshot().pointer);
  // The scratch pool: a cold start from its anchor, no full drain.
  d.full("scratch", 1);
  d.delta("scratch", 2);
  d.point("scratch", 2, 1);
  d.log.clear();
  d.trigger();
  EXPECT_EQ(d.log, (lines{"read_pointer", "read_manifest scratch/weight_v000002",
                          "read_manifest scratch/weight_v000001",
                          "stage scratch/weight_v000002 folding 2 from scratch/weight_v000001",
                          "read_pointer", "commit scratch/weight_v000002",
                          "enter scratch/weight_v000002"}));
  // Back home, keeping what it serves: a run switch (drain all, flush).
  ASSERT_TRUE(d.r.retarget(false));
  EXPECT_EQ(d.r.applied(), (version_ref{"scratch", 2}));
  d.point("home", 2);
  d.log.clear();
  d.trigger();
  EXPECT_EQ(d.count("commit home/weight_v000002 drain_all flush"), 1u);
  EXPECT_EQ(d.log.back(), "enter home/weight_v000002");
  EXPECT_TRUE(d.r.ready());
  EXPECT_EQ(d.r.applied(), (version_ref{"home", 2}));
}

TEST(reconciler, folding_eight_versions_is_one_stage_and_one_commit) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.log.clear();
  for (uint64_t v = 1; v <= 8; ++v)
    d.delta("r", v);
  d.point("r", 8);
  d.trigger();
  EXPECT_EQ(d.count("stage"), 1u);
  EXPECT_EQ(d.count("commit"), 1u);
  EXPECT_EQ(d.count("read_manifest"), 8u);
  EXPECT_EQ(d.log.back(), "commit r/weight_v000008");
  EXPECT_EQ(d.r.metrics().last_folded, 8u);
  EXPECT_EQ(d.r.metrics().folded_versions_total, 9u);
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 8}));
}

TEST(reconciler, all_empty_tail_advances_without_activation) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.log.clear();
  d.delta("r", 1, true);
  d.delta("r", 2, true);
  d.point("r", 2);
  d.trigger();
  EXPECT_EQ(d.log, (lines{"read_pointer", "read_manifest r/weight_v000002",
                          "read_manifest r/weight_v000001", "advance r/weight_v000002"}));
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 2}));
  EXPECT_EQ(d.r.metrics().skipped_activations_total, 1u);
}

TEST(reconciler, run_switch_drains_all_and_flushes) {
  driver d;
  d.chain("a", 3);
  d.trigger(trigger::startup);
  d.log.clear();
  d.full("b", 0);
  d.delta("b", 1);
  d.point("b", 1);
  d.trigger();
  EXPECT_EQ(d.log, (lines{"read_pointer", "read_manifest b/weight_v000001",
                          "read_manifest b/weight_v000000",
                          "stage b/weight_v000001 folding 2 from b/weight_v000000", "read_pointer",
                          "commit b/weight_v000001 drain_all flush"}));
  EXPECT_EQ(d.r.applied(), (version_ref{"b", 1}));
}

TEST(reconciler, resumed_run_boots_above_zero) {
  driver d;
  d.full("r", 40);
  d.delta("r", 41);
  d.point("r", 41, 40);
  d.trigger(trigger::startup);
  EXPECT_TRUE(d.r.ready());
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 41}));
  EXPECT_EQ(d.count("stage r/weight_v000041 folding 2 from r/weight_v000040"), 1u);
}

TEST(reconciler, wakes_during_a_pass_coalesce_into_exactly_one_more_pass) {
  driver d;
  d.chain("r", 2);
  int wakes = 0;
  d.before = [&](const reconcile_effect& e) {
    if (std::holds_alternative<fx::stage>(e)) {
      for (int i = 0; i < 5; ++i) {
        auto none = d.r.on_trigger(trigger::wake);
        EXPECT_TRUE(none.empty()) << "a wake during a pass starts nothing at once";
        ++wakes;
      }
    }
  };
  d.trigger(trigger::startup);
  EXPECT_EQ(wakes, 5);
  EXPECT_EQ(d.r.metrics().passes_total, 2u);
  EXPECT_EQ(d.count("read_pointer"), 3u) << "pass 1 reads twice (with the re-check), pass 2 once";
  EXPECT_FALSE(d.r.busy());
}

TEST(reconciler, lost_wake_converges_on_next_backstop_tick) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1); // published; the wake is lost
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 0}));
  d.trigger(trigger::backstop);
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 1}));
}

TEST(reconciler, no_claimed_run_is_not_ready_with_reason) {
  driver d;
  d.trigger(trigger::startup);
  EXPECT_EQ(d.log, (lines{"read_pointer", "leave no run claimed"}));
  EXPECT_FALSE(d.r.ready());
  EXPECT_EQ(d.r.snapshot().reason, "no run claimed");
  d.log.clear();
  d.trigger(trigger::backstop);
  EXPECT_EQ(d.log, (lines{"read_pointer"})) << "the reason is announced once";
  d.chain("r", 0);
  d.trigger(trigger::wake);
  EXPECT_TRUE(d.r.ready());
}

TEST(reconciler, staging_error_keeps_serving_and_retries_on_next_trigger) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1);
  d.fail_stage = true;
  d.log.clear();
  d.trigger();
  EXPECT_EQ(d.log.back(), "discard_shadow");
  EXPECT_EQ(d.r.state(), sync_state::error);
  EXPECT_NE(d.r.snapshot().reason.find("tensor 'w'"), std::string::npos) << d.r.snapshot().reason;
  EXPECT_TRUE(d.r.ready()) << "the serving weights are untouched";
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 0}));
  EXPECT_EQ(d.count("commit"), 0u);
  d.fail_stage = false;
  d.trigger(trigger::backstop);
  EXPECT_EQ(d.r.state(), sync_state::idle);
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 1}));
  EXPECT_EQ(d.r.metrics().stage_failures_total, 1u);
}

TEST(reconciler, activation_failure_is_terminal_until_rebuilt) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1);
  d.fail_commit = true;
  std::vector<bool> ready_at_rebuild;
  d.before = [&](const reconcile_effect& e) {
    if (std::holds_alternative<fx::rebuild_engine>(e)) {
      ready_at_rebuild.push_back(d.r.ready());
      EXPECT_TRUE(d.r.terminal());
      EXPECT_NE(d.r.snapshot().terminal_error.find("engine crashed"), std::string::npos);
      d.fail_commit = false;
    }
  };
  d.log.clear();
  d.trigger();
  ASSERT_EQ(ready_at_rebuild, std::vector<bool>{false});
  auto leave = std::find_if(d.log.begin(), d.log.end(),
                            [](const std::string& l) { return l.rfind("leave", 0) == 0; });
  ASSERT_NE(leave, d.log.end());
  EXPECT_EQ(*std::next(leave), "rebuild r/weight_v000000") << "rebuilt from the last good version";
  // After the rebuild the replica catches up again and only then re-enters.
  EXPECT_EQ(d.log.back(), "enter r/weight_v000001");
  EXPECT_TRUE(d.r.ready());
  EXPECT_FALSE(d.r.terminal());
  EXPECT_EQ(d.r.metrics().activation_failures_total, 1u);
}

TEST(reconciler, failed_rebuild_is_retried_on_next_trigger) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1);
  d.fail_commit = true;
  d.fail_rebuild = true;
  d.trigger();
  EXPECT_EQ(d.log.back(), "rebuild r/weight_v000000");
  EXPECT_TRUE(d.r.terminal());
  EXPECT_FALSE(d.r.ready());
  EXPECT_FALSE(d.r.busy());
  EXPECT_NE(d.r.snapshot().terminal_error.find("no bytes"), std::string::npos);
  d.fail_commit = false;
  d.fail_rebuild = false;
  d.log.clear();
  d.trigger(trigger::backstop);
  ASSERT_FALSE(d.log.empty());
  EXPECT_EQ(d.log.front(), "rebuild r/weight_v000000");
  EXPECT_EQ(d.log.back(), "enter r/weight_v000001");
  EXPECT_TRUE(d.r.ready());
  EXPECT_FALSE(d.r.terminal());
}

TEST(reconciler, recheck_after_staging_stages_newer_head_before_one_commit) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1);
  bool published = false;
  d.before = [&](const reconcile_effect& e) {
    if (std::holds_alternative<fx::stage>(e) && !published) {
      published = true; // the trainer publishes 2 and 3 while we stage 1
      d.delta("r", 2);
      d.delta("r", 3);
      d.point("r", 3);
    }
  };
  d.log.clear();
  d.trigger();
  EXPECT_EQ(
    d.log,
    (lines{"read_pointer", "read_manifest r/weight_v000001", "stage r/weight_v000001 folding 1",
           "read_pointer", "read_manifest r/weight_v000003", "read_manifest r/weight_v000002",
           "stage r/weight_v000003 folding 2 onto shadow", "commit r/weight_v000003"}));
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 3}));
  EXPECT_EQ(d.r.metrics().last_folded, 3u);
  EXPECT_EQ(d.r.metrics().last_stage, 4s) << "both stages count";
}

TEST(reconciler, run_switch_seen_at_recheck_discards_shadow_and_replans) {
  driver d;
  d.chain("a", 0);
  d.trigger(trigger::startup);
  d.delta("a", 1);
  d.point("a", 1);
  bool switched = false;
  d.before = [&](const reconcile_effect& e) {
    if (std::holds_alternative<fx::stage>(e) && !switched) {
      switched = true;
      d.full("b", 0);
      d.point("b", 0);
    }
  };
  d.log.clear();
  d.trigger();
  EXPECT_EQ(d.count("discard_shadow"), 1u);
  EXPECT_EQ(d.count("commit"), 1u);
  EXPECT_EQ(d.log.back(), "commit b/weight_v000000 drain_all flush");
  EXPECT_EQ(d.r.applied(), (version_ref{"b", 0}));
}

TEST(reconciler, missing_link_is_an_error_naming_the_version) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 2);
  d.point("r", 2);
  d.trigger();
  EXPECT_EQ(d.r.state(), sync_state::error);
  EXPECT_NE(d.r.snapshot().reason.find("r/weight_v000001"), std::string::npos)
    << d.r.snapshot().reason;
  EXPECT_EQ(d.r.applied(), (version_ref{"r", 0}));
}

TEST(reconciler, pointer_read_failure_is_an_error_and_retried) {
  driver d;
  d.chain("r", 0);
  d.fail_pointer = true;
  d.trigger(trigger::startup);
  EXPECT_EQ(d.r.state(), sync_state::error);
  EXPECT_NE(d.r.snapshot().reason.find("store down"), std::string::npos);
  EXPECT_FALSE(d.r.ready());
  d.fail_pointer = false;
  d.trigger(trigger::backstop);
  EXPECT_TRUE(d.r.ready());
}

TEST(reconciler, stale_completions_are_ignored) {
  driver d;
  d.chain("r", 0);
  auto fx1 = d.r.on_trigger(trigger::startup);
  auto op = std::get<fx::read_pointer>(fx1[0]).op;
  EXPECT_TRUE(d.r.on_pointer_read(op + 7, d.pointer).empty());
  EXPECT_TRUE(d.r.on_staged(op, {}, 1s).empty());
  EXPECT_TRUE(d.r.on_committed(op, {}, 1s).empty());
  auto next = d.r.on_pointer_read(op, d.pointer);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<fx::read_manifest>(next[0]));
  // Answering the same pointer read twice does not advance the pass twice.
  EXPECT_TRUE(d.r.on_pointer_read(op, d.pointer).empty());
}

TEST(reconciler, ready_latches_across_later_passes) {
  driver d;
  d.chain("r", 0);
  d.trigger(trigger::startup);
  d.delta("r", 1);
  d.point("r", 1);
  bool checked = false;
  d.before = [&](const reconcile_effect& e) {
    if (std::holds_alternative<fx::stage>(e)) {
      EXPECT_TRUE(d.r.ready()) << "a replica behind the pointer stays in rotation while staging";
      EXPECT_EQ(d.r.state(), sync_state::staging);
      checked = true;
    }
  };
  d.trigger();
  EXPECT_TRUE(checked);
  EXPECT_EQ(d.count("enter"), 1u) << "entered rotation once";
}

TEST(reconciler, sync_states_print_as_in_server_info) {
  EXPECT_EQ(to_string(sync_state::idle), "IDLE");
  EXPECT_EQ(to_string(sync_state::fetching), "FETCHING");
  EXPECT_EQ(to_string(sync_state::staging), "STAGING");
  EXPECT_EQ(to_string(sync_state::committing), "COMMITTING");
  EXPECT_EQ(to_string(sync_state::error), "ERROR");
}

} // namespace
} // namespace stitch
