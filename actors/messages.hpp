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

#include "actors/value_types.hpp"
#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/engine/rollout_client.hpp"

namespace stitch {

/// A request to a replica's HTTP surface, as the gateway or the replica's own
/// endpoint hands it over (the body travels as text, DESIGN §2).
struct replica_call {
  /// Chosen by the caller, unique among its requests in flight at this
  /// replica: `cancel` names it, streamed events carry it.
  uint64_t key = 0;
  std::string method = "POST";
  /// The path: a versioned route (`/generate`, `/v1/completions`,
  /// `/v1/chat/completions`) or one passed through to the engine.
  std::string route;
  /// The body with its `weight_version` member removed.
  std::string body;
  /// The constraint (body and headers merged): -1 = absent.
  int64_t min_version = -1;
  int64_t exact_version = -1;
};

/// A replica's answer. For a stream, `body` is the last event (stamped); the
/// events before it went to the caller as `(event, key, json)` messages.
struct replica_answer {
  uint16_t status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool stream = false;
  /// Seconds for `Retry-After` (0 = none).
  uint32_t retry_after = 0;
  /// Error answers: the `type` of the error body, and whether retrying helps.
  std::string error_type;
  bool retryable = false;
  /// 409: the replica's applied version (-1 = none).
  int64_t applied = -1;
  /// Versioned 200 answers: the stamps and the run.
  bool stamped = false;
  uint64_t weight_version_start = 0;
  uint64_t weight_version_end = 0;
  std::string run_id;
  std::string replica_id;
};

/// Counters and timings of one replica (DESIGN §5 `server_info.metrics`).
struct replica_metrics {
  double last_stage_s = 0;
  double last_drain_ms = 0;
  /// The time the engine was stopped by the last activation.
  double last_pause_us = 0;
  double max_pause_us = 0;
  uint64_t last_folded = 0;
  uint64_t folded_versions_total = 0;
  uint64_t activations_total = 0;
  uint64_t skipped_activations_total = 0;
  uint64_t stages_total = 0;
  uint64_t stage_failures_total = 0;
  uint64_t activation_failures_total = 0;
  uint64_t checksum_failures_total = 0;
  uint64_t rebuilds_total = 0;
  uint64_t bytes_fetched_total = 0;
  uint64_t requests_admitted_total = 0;
  uint64_t requests_rejected_total = 0;
  uint64_t requests_completed_total = 0;
  uint64_t drain_timeouts_total = 0;
};

/// A replica's `server_info` (DESIGN §5).
struct replica_info {
  std::string replica_id;
  std::string pool;
  bool ready = false;
  /// The identity string `run/weight_v000007`; empty before the first activation.
  std::string applied;
  /// -1 before the first activation.
  int64_t applied_version = -1;
  std::string run_id;
  /// The pointer as last read (identity string, empty when none).
  std::string pointer;
  std::string sync_state = "IDLE";
  std::string reason;
  std::string terminal_error;
  std::string commit_mode;
  uint64_t active_requests = 0;
  uint64_t queued_requests = 0;
  replica_metrics metrics;
};

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

/// A replica worker's report on a slow step (stage, activation, rebuild):
/// `code` 0 = success, otherwise an `errc` with its message.
struct work_report {
  uint64_t op = 0;
  uint8_t code = 0;
  std::string message;
  int64_t nanos = 0;
  version_ref version;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_call& x) {
  return f(caf::meta::type_name("stitch.replica_call"), x.key, x.method, x.route, x.body,
           x.min_version, x.exact_version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_answer& x) {
  return f(caf::meta::type_name("stitch.replica_answer"), x.status, x.content_type, x.body,
           x.stream, x.retry_after, x.error_type, x.retryable, x.applied, x.stamped,
           x.weight_version_start, x.weight_version_end, x.run_id, x.replica_id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_metrics& x) {
  return f(caf::meta::type_name("stitch.replica_metrics"), x.last_stage_s, x.last_drain_ms,
           x.last_pause_us, x.max_pause_us, x.last_folded, x.folded_versions_total,
           x.activations_total, x.skipped_activations_total, x.stages_total, x.stage_failures_total,
           x.activation_failures_total, x.checksum_failures_total, x.rebuilds_total,
           x.bytes_fetched_total, x.requests_admitted_total, x.requests_rejected_total,
           x.requests_completed_total, x.drain_timeouts_total);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_info& x) {
  return f(caf::meta::type_name("stitch.replica_info"), x.replica_id, x.pool, x.ready, x.applied,
           x.applied_version, x.run_id, x.pointer, x.sync_state, x.reason, x.terminal_error,
           x.commit_mode, x.active_requests, x.queued_requests, x.metrics);
}

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
typename Inspector::result_type inspect(Inspector& f, work_report& x) {
  return f(caf::meta::type_name("stitch.work_report"), x.op, x.code, x.message, x.nanos, x.version);
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
CAF_ADD_TYPE_ID(stitch, (stitch::replica_call))
CAF_ADD_TYPE_ID(stitch, (stitch::replica_answer))
CAF_ADD_TYPE_ID(stitch, (stitch::replica_metrics))
CAF_ADD_TYPE_ID(stitch, (stitch::replica_info))
CAF_ADD_TYPE_ID(stitch, (stitch::work_report))
CAF_ADD_TYPE_ID(stitch, (std::vector<stitch::replica_info>) )
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
CAF_ADD_ATOM(stitch, stitch::atom, generate, "generate")
CAF_ADD_ATOM(stitch, stitch::atom, cancel, "cancel")
CAF_ADD_ATOM(stitch, stitch::atom, wake, "wake")
CAF_ADD_ATOM(stitch, stitch::atom, server_info, "srvinfo")
CAF_ADD_ATOM(stitch, stitch::atom, drain_check, "drainchk")
CAF_ADD_ATOM(stitch, stitch::atom, staged, "staged")
CAF_ADD_ATOM(stitch, stitch::atom, committed, "committed")
CAF_ADD_ATOM(stitch, stitch::atom, rebuilt, "rebuilt")
CAF_ADD_ATOM(stitch, stitch::atom, generated, "generated")
CAF_ADD_ATOM(stitch, stitch::atom, event, "event")
CAF_ADD_ATOM(stitch, stitch::atom, replica_state, "replstate")
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
CAF_ADD_ATOM(stitch, stitch::atom, retire, "retire")
CAF_ADD_ATOM(stitch, stitch::atom, train, "train")
CAF_ADD_ATOM(stitch, stitch::atom, rollouts, "rollouts")
CAF_END_TYPE_ID_BLOCK(stitch)

static_assert(caf::id_block::stitch::end <= stitch::type_ids::handles);
