#pragma once

// Messages of the roles that do not declare their own yet: their atoms and
// message types and `inspect` overloads.
// Included by actor interfaces and implementations only.

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/replica_actor.hpp"
#include "actors/value_types.hpp"
#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/engine/rollout_client.hpp"

namespace stitch {

/// A cumulative histogram in the Prometheus sense: `counts[i]` observations
/// were at most `bounds[i]` (and above the previous bound); the last count is
/// everything above the last bound.
struct histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0;
  uint64_t count = 0;

  static histogram with_bounds(std::vector<double> b) {
    histogram h;
    h.counts.assign(b.size() + 1, 0);
    h.bounds = std::move(b);
    return h;
  }
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i])
      ++i;
    if (counts.size() != bounds.size() + 1)
      counts.assign(bounds.size() + 1, 0);
    ++counts[i];
    sum += v;
    ++count;
  }
};

/// What the gateway measured: request latency, staleness of served samples
/// (pointer version minus the start stamp) and answers by status code.
struct gateway_stats {
  histogram latency_seconds;
  histogram staleness_versions;
  std::vector<uint16_t> codes;
  std::vector<uint64_t> code_counts;
  uint64_t retries_total = 0;
  /// Staleness of the last stamped answer (-1 before the first).
  double last_staleness = -1;
};

/// What a trainer asks a rollout driver for: `count` rollouts of the toy
/// task through the gateway at `host:port` with `min_version`.
struct rollout_request {
  std::string gateway_host;
  uint16_t gateway_port = 0;
  std::string pool = "default";
  uint64_t min_version = 0;
  uint32_t count = 0;
  uint64_t seed_base = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, histogram& x) {
  return f(caf::meta::type_name("stitch.histogram"), x.bounds, x.counts, x.sum, x.count);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gateway_stats& x) {
  return f(caf::meta::type_name("stitch.gateway_stats"), x.latency_seconds, x.staleness_versions,
           x.codes, x.code_counts, x.retries_total, x.last_staleness);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_request& x) {
  return f(caf::meta::type_name("stitch.rollout_request"), x.gateway_host, x.gateway_port, x.pool,
           x.min_version, x.count, x.seed_base);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("stitch.member_info"), x.name, x.roles, x.slots, x.gateway_http);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trainer_spec& x) {
  return f(caf::meta::type_name("stitch.trainer_spec"), x.enabled, x.steps, x.samples_per_step,
           x.staleness, x.learning_rate);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, experiment_spec& x) {
  return f(caf::meta::type_name("stitch.experiment_spec"), x.run_id, x.pool, x.replicas,
           x.commit_mode, x.boot_preset, x.boot_seed, x.boot_dir, x.boot_version, x.trainer);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement& x) {
  return f(caf::meta::type_name("stitch.placement"), x.replica_id, x.run_id, x.pool, x.node, x.slot,
           x.retiring);
}

namespace engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_sample& x) {
  return f(caf::meta::type_name("stitch.rollout_sample"), x.prompt, x.tokens, x.behaviour_logprobs,
           x.reward, x.version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_result& x) {
  return f(caf::meta::type_name("stitch.rollout_result"), x.ok, x.sample, x.violation, x.error);
}

} // namespace engine

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch, ::stitch::type_ids::shared)
CAF_ADD_TYPE_ID(stitch, (stitch::histogram))
CAF_ADD_TYPE_ID(stitch, (stitch::gateway_stats))
CAF_ADD_TYPE_ID(stitch, (stitch::member_info))
CAF_ADD_TYPE_ID(stitch, (stitch::trainer_spec))
CAF_ADD_TYPE_ID(stitch, (stitch::experiment_spec))
CAF_ADD_TYPE_ID(stitch, (stitch::placement))
CAF_ADD_TYPE_ID(stitch, (stitch::rollout_request))
CAF_ADD_TYPE_ID(stitch, (stitch::engine::rollout_sample))
CAF_ADD_TYPE_ID(stitch, (stitch::engine::rollout_result))
CAF_ADD_TYPE_ID(stitch, (std::vector<stitch::engine::rollout_result>) )
CAF_ADD_ATOM(stitch, stitch::atom, lookup, "lookup")
CAF_ADD_ATOM(stitch, stitch::atom, enroll, "enroll")
CAF_ADD_ATOM(stitch, stitch::atom, pool_view, "poolview")
CAF_ADD_ATOM(stitch, stitch::atom, stats, "stats")
CAF_ADD_ATOM(stitch, stitch::atom, status_view, "statusview")
CAF_ADD_ATOM(stitch, stitch::atom, metrics, "metrics")
CAF_ADD_ATOM(stitch, stitch::atom, join, "join")
CAF_ADD_ATOM(stitch, stitch::atom, heartbeat, "heartbeat")
CAF_ADD_ATOM(stitch, stitch::atom, submit, "submit")
CAF_ADD_ATOM(stitch, stitch::atom, scale, "scale")
CAF_ADD_ATOM(stitch, stitch::atom, stop, "stop")
CAF_ADD_ATOM(stitch, stitch::atom, cluster_view, "clusterv")
CAF_ADD_ATOM(stitch, stitch::atom, replica_down, "repldown")
CAF_ADD_ATOM(stitch, stitch::atom, progress, "progress")
CAF_ADD_ATOM(stitch, stitch::atom, trained, "trained")
CAF_ADD_ATOM(stitch, stitch::atom, spawn, "spawn")
CAF_ADD_ATOM(stitch, stitch::atom, train, "train")
CAF_ADD_ATOM(stitch, stitch::atom, rollouts, "rollouts")
CAF_END_TYPE_ID_BLOCK(stitch)

static_assert(caf::id_block::stitch::end <= stitch::type_ids::handles);
