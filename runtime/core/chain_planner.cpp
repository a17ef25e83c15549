#include "runtime/core/chain_planner.hpp"

#include <algorithm>

namespace stitch {

namespace {

status check_link(const manifest& m, const version_ref& expected) {
  if (m.ref != expected)
    return make_error(errc::invalid_manifest,
                      "manifest stored for " + to_string(expected) + " names " + to_string(m.ref));
  if (!m.is_full() && m.base_version != expected.version - 1)
    return make_error(errc::invalid_manifest, "delta " + to_string(expected)
                                                + " does not build on version "
                                                + std::to_string(expected.version - 1));
  return {};
}

} // namespace

result<plan_outcome> plan_chain(const std::optional<applied_state>& applied,
                                const version_ref& pointer, uint64_t boot_version,
                                const manifest_lookup& lookup) {
  if (pointer.version < boot_version)
    return make_error(errc::invalid_argument, "pointer " + to_string(pointer)
                                                + " is below its run's boot version "
                                                + std::to_string(boot_version));
  chain_plan plan;
  plan.target = pointer;
  const bool same_run = applied && applied->ref.run_id == pointer.run_id;
  plan.reset_to_boot = applied && !same_run;
  const bool build_on_applied = same_run && applied->usable
                                && applied->ref.version <= pointer.version
                                && applied->ref.version >= boot_version;
  if (build_on_applied && applied->ref.version == pointer.version)
    return plan_outcome{std::move(plan)};

  // Walk back from the pointer collecting links until the applied version or an
  // anchor; nothing below the boot belongs to the run.
  std::vector<const manifest*> tail;
  const uint64_t floor = build_on_applied ? applied->ref.version + 1 : boot_version;
  for (uint64_t v = pointer.version;; --v) {
    version_ref ref{pointer.run_id, v};
    auto found = lookup(ref);
    if (std::holds_alternative<manifest_pending>(found))
      return plan_outcome{needs_manifest{ref}};
    if (std::holds_alternative<manifest_missing>(found))
      return make_error(errc::missing_link, "the chain to " + to_string(pointer)
                                              + " is missing version " + to_string(ref));
    const manifest* m = std::get<manifest_found>(found).m;
    if (auto ok = check_link(*m, ref); !ok)
      return std::move(ok).error();
    tail.push_back(m);
    if (m->is_full())
      break;
    if (v == floor) {
      if (!build_on_applied)
        return make_error(errc::missing_link, "no full anchor at or above boot version "
                                                + std::to_string(boot_version) + " of run '"
                                                + pointer.run_id + "'");
      break;
    }
  }
  std::reverse(tail.begin(), tail.end());
  auto first = tail.begin();
  if ((*first)->is_full()) {
    plan.anchor = (*first)->ref;
    for (const auto& [name, shard] : (*first)->weight_map)
      plan.touched.insert(name);
    ++first;
  }
  for (auto it = first; it != tail.end(); ++it) {
    plan.deltas.push_back((*it)->ref);
    plan.touched.insert((*it)->touched.begin(), (*it)->touched.end());
  }
  plan.activation_needed = plan.anchor.has_value() || plan.reset_to_boot || !plan.touched.empty();
  return plan_outcome{std::move(plan)};
}

chain_plan boot_plan(const version_ref& ref) {
  chain_plan plan;
  plan.target = ref;
  plan.anchor = ref;
  plan.reset_to_boot = true;
  plan.activation_needed = true;
  return plan;
}

} // namespace stitch
