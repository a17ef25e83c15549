#include <gtest/gtest.h>

#include <map>

#include "runtime/core/chain_planner.hpp"

namespace stitch {
namespace {

/// A store's worth of manifests, looked up by the planner.
class chain_store {
public:
  void full(const std::string& run, uint64_t v, std::vector<std::string> tensors = {"a", "b"}) {
    manifest m;
    m.ref = {run, v};
    m.kind = version_kind::full;
    m.shards = {"model-00001-of-00001.safetensors"};
    for (auto& t : tensors)
      m.weight_map[t] = m.shards.front();
    m.touched = tensors;
    manifests_[m.ref] = m;
  }
  void delta(const std::string& run, uint64_t v, std::vector<std::string> touched) {
    manifest m;
    m.ref = {run, v};
    m.kind = version_kind::delta;
    m.base_version = v - 1;
    m.encoding = delta_encoding::xor_bytes;
    m.shards = {"model-00001-of-00001.safetensors"};
    for (auto& t : touched)
      m.weight_map[t] = m.shards.front();
    m.touched = touched;
    manifests_[m.ref] = m;
  }
  manifest& at(const std::string& run, uint64_t v) { return manifests_.at({run, v}); }
  void forget(const std::string& run, uint64_t v) { manifests_.erase({run, v}); }

  /// Every lookup answers; nothing is pending.
  manifest_lookup complete() {
    return [this](const version_ref& ref) -> manifest_lookup_result {
      ++lookups;
      if (auto it = manifests_.find(ref); it != manifests_.end())
        return manifest_found{&it->second};
      return manifest_missing{};
    };
  }
  int lookups = 0;

private:
  std::map<version_ref, manifest> manifests_;
};

chain_plan plan_of(const result<plan_outcome>& r) {
  EXPECT_TRUE(r) << (r ? "" : to_string(r.error()));
  EXPECT_TRUE(std::holds_alternative<chain_plan>(*r));
  return std::get<chain_plan>(*r);
}

std::vector<version_ref> refs(const std::string& run, std::initializer_list<uint64_t> vs) {
  std::vector<version_ref> out;
  for (auto v : vs)
    out.push_back({run, v});
  return out;
}

TEST(chain_planner, up_to_date_plans_nothing) {
  chain_store s;
  s.full("r", 0);
  auto p = plan_of(plan_chain(applied_state{{"r", 0}}, {"r", 0}, 0, s.complete()));
  EXPECT_EQ(p.folded_versions(), 0u);
  EXPECT_FALSE(p.activation_needed);
  EXPECT_FALSE(p.reset_to_boot);
  EXPECT_EQ(s.lookups, 0);
}

TEST(chain_planner, cold_start_seeds_from_nearest_anchor) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  s.full("r", 2);
  s.delta("r", 3, {"b"});
  s.delta("r", 4, {"a"});
  auto p = plan_of(plan_chain(std::nullopt, {"r", 4}, 0, s.complete()));
  EXPECT_FALSE(p.reset_to_boot);
  EXPECT_EQ(p.anchor, (version_ref{"r", 2}));
  EXPECT_EQ(p.deltas, refs("r", {3, 4}));
  EXPECT_EQ(p.touched, (std::set<std::string>{"a", "b"}));
  EXPECT_TRUE(p.activation_needed);
  EXPECT_EQ(s.lookups, 3) << "the walk stops at the anchor";
}

TEST(chain_planner, catch_up_folds_deltas_onto_applied_state) {
  chain_store s;
  s.full("r", 0);
  for (uint64_t v = 1; v <= 8; ++v)
    s.delta("r", v, {v % 2 ? "a" : "c"});
  auto p = plan_of(plan_chain(applied_state{{"r", 0}}, {"r", 8}, 0, s.complete()));
  EXPECT_FALSE(p.anchor);
  EXPECT_EQ(p.deltas, refs("r", {1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(p.touched, (std::set<std::string>{"a", "c"}));
  EXPECT_EQ(p.folded_versions(), 8u);
  EXPECT_TRUE(p.activation_needed);
}

TEST(chain_planner, all_empty_tail_needs_no_activation) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {});
  s.delta("r", 2, {});
  auto p = plan_of(plan_chain(applied_state{{"r", 0}}, {"r", 2}, 0, s.complete()));
  EXPECT_EQ(p.deltas, refs("r", {1, 2}));
  EXPECT_TRUE(p.touched.empty());
  EXPECT_FALSE(p.activation_needed);
}

TEST(chain_planner, run_switch_resets_to_the_new_runs_chain) {
  chain_store s;
  s.full("old", 0);
  s.full("new", 5);
  s.delta("new", 6, {"a"});
  auto p = plan_of(plan_chain(applied_state{{"old", 0}}, {"new", 6}, 5, s.complete()));
  EXPECT_TRUE(p.reset_to_boot);
  EXPECT_EQ(p.anchor, (version_ref{"new", 5}));
  EXPECT_EQ(p.deltas, refs("new", {6}));
  EXPECT_TRUE(p.activation_needed);
}

TEST(chain_planner, run_switch_to_boot_with_empty_tail_still_activates) {
  chain_store s;
  s.full("new", 0);
  auto p = plan_of(plan_chain(applied_state{{"old", 3}}, {"new", 0}, 0, s.complete()));
  EXPECT_TRUE(p.reset_to_boot);
  EXPECT_TRUE(p.activation_needed);
}

TEST(chain_planner, unusable_applied_state_walks_back_to_anchor) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  s.delta("r", 2, {"b"});
  auto p = plan_of(plan_chain(applied_state{{"r", 1}, false}, {"r", 2}, 0, s.complete()));
  EXPECT_FALSE(p.reset_to_boot);
  EXPECT_EQ(p.anchor, (version_ref{"r", 0}));
  EXPECT_EQ(p.deltas, refs("r", {1, 2}));
}

TEST(chain_planner, applied_ahead_of_pointer_is_reseeded) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  auto p = plan_of(plan_chain(applied_state{{"r", 4}}, {"r", 1}, 0, s.complete()));
  EXPECT_EQ(p.anchor, (version_ref{"r", 0}));
  EXPECT_EQ(p.deltas, refs("r", {1}));
}

TEST(chain_planner, missing_link_names_the_version) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  s.delta("r", 3, {"a"});
  auto r = plan_chain(applied_state{{"r", 0}}, {"r", 3}, 0, s.complete());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::missing_link);
  EXPECT_NE(r.error().message.find("r/weight_v000002"), std::string::npos) << r.error().message;
}

TEST(chain_planner, chain_without_anchor_above_boot_is_an_error) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  s.delta("r", 2, {"a"});
  // A boot of 1 that is a delta: the run's claim is broken.
  auto r = plan_chain(std::nullopt, {"r", 2}, 1, s.complete());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::missing_link);
}

TEST(chain_planner, link_with_wrong_base_is_invalid) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  s.at("r", 1).base_version = 7;
  auto r = plan_chain(applied_state{{"r", 0}}, {"r", 1}, 0, s.complete());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_manifest);
}

TEST(chain_planner, pending_lookup_asks_for_that_manifest) {
  chain_store s;
  s.full("r", 0);
  s.delta("r", 1, {"a"});
  manifest_lookup lookup = [&](const version_ref& ref) -> manifest_lookup_result {
    if (ref.version == 1)
      return manifest_pending{};
    return s.complete()(ref);
  };
  auto r = plan_chain(applied_state{{"r", 0}}, {"r", 1}, 0, lookup);
  ASSERT_TRUE(r);
  ASSERT_TRUE(std::holds_alternative<needs_manifest>(*r));
  EXPECT_EQ(std::get<needs_manifest>(*r).ref, (version_ref{"r", 1}));
}

TEST(chain_planner, pointer_below_boot_is_refused) {
  chain_store s;
  auto r = plan_chain(std::nullopt, {"r", 2}, 5, s.complete());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
}

} // namespace
} // namespace stitch
