#pragma once

#include <caf/error.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/store_actor.hpp"
#include "actors/value_types.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/core/http_errors.hpp"
#include "runtime/core/reconciler.hpp"

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
  /// The constraint (body and headers merged by the surface that received it).
  constraint c;
};

/// A replica's (or the gateway's) answer. For a stream, `body` is the last
/// event (stamped); the events before it went to the caller as
/// `(event, key, json)` messages.
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
  /// Versioned 200 answers: the stamps and the run.
  std::optional<stamps> stamped;
  std::string run_id;
  std::string replica_id;
};

/// The answer for an error (the one mapping of `runtime/core/http_errors`).
replica_answer answer_of(const http_error& e);

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
  /// Verified bytes fetched from peers that held the version.
  uint64_t bytes_from_peers_total = 0;
  /// Of those, bytes of delta frames (the rest are whole tensors).
  uint64_t delta_bytes_from_peers_total = 0;
  /// Bytes read from the store (the fallback path).
  uint64_t bytes_from_store_total = 0;
  uint64_t requests_admitted_total = 0;
  uint64_t requests_rejected_total = 0;
  uint64_t requests_completed_total = 0;
  uint64_t drain_timeouts_total = 0;
};

/// Where the bytes of a replica's last stage came from (`/status`
/// "transfers").
struct fetch_summary {
  /// The version staged; none before the first stage.
  std::optional<version_ref> version;
  /// Verified bytes from peers, by holder.
  std::map<std::string, uint64_t> from_peers;
  /// Of those, bytes of delta frames (deltas over peers) and of whole
  /// tensors.
  uint64_t peer_delta_bytes = 0;
  uint64_t peer_full_bytes = 0;
  /// What the staged version stores (its manifest's `total_size`: the
  /// delta's frames, or an anchor's tensors), beside the bytes on the wire.
  uint64_t stored_bytes = 0;
  /// Stored bytes read from the store.
  uint64_t from_store = 0;
  double seconds = 0;
  /// Of `seconds`: reading bytes (store and peers), decoding delta frames,
  /// verifying checksums (exclusive of each other; the rest is the engine's
  /// own work).
  double fetch_s = 0;
  double decode_s = 0;
  double verify_s = 0;
  /// What went wrong with peers (the first few lines), if anything.
  std::vector<std::string> problems;
};

/// One step of `stitch profile`: what the replica did to reach `target` from
/// the moment it was told the pointer moved, each part timed apart.
struct profile_step {
  version_ref target;
  /// What it activated from: none (a cold start), or the version before.
  std::optional<version_ref> from;
  /// An activation happened (false: the tail changed no weights).
  bool activated = false;
  /// The plan started over from the target run's chain (a run switch).
  bool reset = false;
  uint64_t folded = 0;
  /// Preparation while serving: the whole stage, and its phases (exclusive;
  /// `rest_s` is what the engine did besides fetching, decoding and
  /// verifying: allocating, copying, building the shadow or its load).
  double stage_s = 0;
  double fetch_s = 0;
  double decode_s = 0;
  double verify_s = 0;
  double rest_s = 0;
  double drain_ms = 0;
  double pause_us = 0;
  /// From the trigger to serving the target, store reads included.
  double total_s = 0;
  uint64_t bytes_from_store = 0;
  uint64_t bytes_from_peers = 0;
  /// How the engine loaded the step's weights (`engine_load_report`;
  /// empty kind: an engine that swaps them in memory, or no activation).
  std::string load_kind;
  std::string load_detail;
  uint64_t load_tensors = 0;
  uint64_t load_bytes = 0;
  double load_s = 0;
  /// The checksum verdict after the step, and what it was computed over.
  bool checksum_ok = false;
  std::string checksum_basis;
  std::string checksum_detail;
};

/// A replica's `server_info` (DESIGN §5).
struct replica_info {
  std::string replica_id;
  std::string pool;
  bool ready = false;
  /// What the replica last activated; none before the first activation.
  std::optional<version_ref> applied;
  /// The version new requests start on (it leads `applied` while an
  /// all-empty tail is skipped); none before the first activation.
  std::optional<uint64_t> serving;
  /// The pointer as last read; none before a run is claimed.
  std::optional<version_ref> pointer;
  sync_state state = sync_state::idle;
  std::string reason;
  /// Set after an activation failure the rebuild could not repair.
  std::optional<std::string> terminal_error;
  commit_mode mode = commit_mode::in_place;
  uint64_t active_requests = 0;
  uint64_t queued_requests = 0;
  replica_metrics metrics;
  /// How this replica moves weight bytes: "ucx (<transports>)" or why it
  /// reads only from the store.
  std::string transport;
  /// The engine's answers carry `weight_version_spans` (which version made
  /// which tokens); else only the start and end stamps.
  bool version_spans = false;
  /// The engine as it reports itself (`engine_port::health`): what it is,
  /// what it serves, its last problem.
  std::string engine;
  bool engine_healthy = false;
  fetch_summary last_fetch;
  /// Where the engine computes, its device memory and staging counters.
  engine_device_usage device;

  std::string run_id() const { return applied ? applied->run_id : std::string{}; }
};

/// Why a replica in rotation is not profiled without `--take-out` (the
/// replica's refusal, and the CLI's before it copies any weights).
std::string in_rotation_refusal(const replica_info& info);

/// A replica worker's report on a slow step (stage, activation, rebuild).
struct work_report {
  uint64_t op = 0;
  /// None on success; otherwise an error of the `stitch` category.
  caf::error err;
  int64_t nanos = 0;
  version_ref version;
  /// Stages: where the bytes came from.
  fetch_summary fetched;
};

/// One tensor a replica offers to peers (`transport::ucx::offered_tensor`):
/// where its registered bytes are and its 1 MiB chunk digests.
struct peer_tensor {
  std::string name;
  uint64_t address = 0;
  uint64_t size = 0;
  std::string rkey;
  std::vector<uint64_t> leaves;
  uint32_t progress_slot = 0;
};

/// A holder's lease on the version it holds or is fetching
/// (`transport::ucx::offer`).
struct peer_offer {
  std::string source;
  version_ref version;
  std::string worker_address;
  uint64_t lease = 0;
  std::vector<peer_tensor> tensors;
  bool partial = false;
  uint64_t progress_address = 0;
  std::string progress_rkey;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_call& x) {
  return f(caf::meta::type_name("stitch.replica_call"), x.key, x.method, x.route, x.body, x.c);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_answer& x) {
  optional_proxy<stamps> stamped{x.stamped};
  return f(caf::meta::type_name("stitch.replica_answer"), x.status, x.content_type, x.body,
           x.stream, x.retry_after, x.error_type, x.retryable, stamped.field, x.run_id,
           x.replica_id, stamped.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_metrics& x) {
  return f(caf::meta::type_name("stitch.replica_metrics"), x.last_stage_s, x.last_drain_ms,
           x.last_pause_us, x.max_pause_us, x.last_folded, x.folded_versions_total,
           x.activations_total, x.skipped_activations_total, x.stages_total, x.stage_failures_total,
           x.activation_failures_total, x.checksum_failures_total, x.rebuilds_total,
           x.bytes_fetched_total, x.bytes_from_peers_total, x.delta_bytes_from_peers_total,
           x.bytes_from_store_total, x.requests_admitted_total, x.requests_rejected_total,
           x.requests_completed_total, x.drain_timeouts_total);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetch_summary& x) {
  optional_proxy<version_ref> version{x.version};
  return f(caf::meta::type_name("stitch.fetch_summary"), version.field, x.from_peers,
           x.peer_delta_bytes, x.peer_full_bytes, x.stored_bytes, x.from_store, x.seconds,
           x.fetch_s, x.decode_s, x.verify_s, x.problems, version.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, profile_step& x) {
  optional_proxy<version_ref> from{x.from};
  return f(caf::meta::type_name("stitch.profile_step"), x.target, from.field, x.activated, x.reset,
           x.folded, x.stage_s, x.fetch_s, x.decode_s, x.verify_s, x.rest_s, x.drain_ms, x.pause_us,
           x.total_s, x.bytes_from_store, x.bytes_from_peers, x.load_kind, x.load_detail,
           x.load_tensors, x.load_bytes, x.load_s, x.checksum_ok, x.checksum_basis,
           x.checksum_detail, from.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_tensor& x) {
  return f(caf::meta::type_name("stitch.peer_tensor"), x.name, x.address, x.size, x.rkey, x.leaves,
           x.progress_slot);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_offer& x) {
  return f(caf::meta::type_name("stitch.peer_offer"), x.source, x.version, x.worker_address,
           x.lease, x.tensors, x.partial, x.progress_address, x.progress_rkey);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_device_usage& x) {
  return f(caf::meta::type_name("stitch.engine_device_usage"), x.device, x.name, x.memory_used,
           x.memory_total, x.staged_bytes_total, x.staging_seconds_total,
           x.host_recycled_kept_bytes, x.host_recycled_bytes_total);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_info& x) {
  optional_proxy<version_ref> applied{x.applied};
  optional_proxy<uint64_t> serving{x.serving};
  optional_proxy<version_ref> pointer{x.pointer};
  optional_proxy<std::string> terminal{x.terminal_error};
  return f(caf::meta::type_name("stitch.replica_info"), x.replica_id, x.pool, x.ready,
           applied.field, serving.field, pointer.field, x.state, x.reason, terminal.field, x.mode,
           x.active_requests, x.queued_requests, x.metrics, x.transport, x.version_spans, x.engine,
           x.engine_healthy, x.last_fetch, x.device, applied.commit(), serving.commit(),
           pointer.commit(), terminal.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_report& x) {
  return f(caf::meta::type_name("stitch.work_report"), x.op, x.err, x.nanos, x.version, x.fetched);
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_replica, ::stitch::type_ids::replica)
CAF_ADD_TYPE_ID(stitch_replica, (stitch::replica_call))
CAF_ADD_TYPE_ID(stitch_replica, (stitch::replica_answer))
CAF_ADD_TYPE_ID(stitch_replica, (stitch::replica_metrics))
CAF_ADD_TYPE_ID(stitch_replica, (stitch::replica_info))
CAF_ADD_TYPE_ID(stitch_replica, (std::vector<stitch::replica_info>) )
CAF_ADD_TYPE_ID(stitch_replica, (stitch::work_report))
CAF_ADD_TYPE_ID(stitch_replica, (stitch::peer_offer))
CAF_ADD_TYPE_ID(stitch_replica, (caf::optional<uint64_t>) )
CAF_ADD_TYPE_ID(stitch_replica, (stitch::profile_step))
CAF_ADD_ATOM(stitch_replica, stitch::atom, generate, "generate")
CAF_ADD_ATOM(stitch_replica, stitch::atom, cancel, "cancel")
CAF_ADD_ATOM(stitch_replica, stitch::atom, wake, "wake")
CAF_ADD_ATOM(stitch_replica, stitch::atom, retire, "retire")
CAF_ADD_ATOM(stitch_replica, stitch::atom, server_info, "srvinfo")
CAF_ADD_ATOM(stitch_replica, stitch::atom, replica_state, "replstate")
CAF_ADD_ATOM(stitch_replica, stitch::atom, event, "event")
CAF_ADD_ATOM(stitch_replica, stitch::atom, drain_check, "drainchk")
CAF_ADD_ATOM(stitch_replica, stitch::atom, staged, "staged")
CAF_ADD_ATOM(stitch_replica, stitch::atom, committed, "committed")
CAF_ADD_ATOM(stitch_replica, stitch::atom, rebuilt, "rebuilt")
CAF_ADD_ATOM(stitch_replica, stitch::atom, generated, "generated")
CAF_ADD_ATOM(stitch_replica, stitch::atom, offer, "offer")
CAF_ADD_ATOM(stitch_replica, stitch::atom, release, "release")
CAF_ADD_ATOM(stitch_replica, stitch::atom, profile, "profile")
CAF_ADD_ATOM(stitch_replica, stitch::atom, lane_work, "lanework")
CAF_END_TYPE_ID_BLOCK(stitch_replica)

static_assert(caf::id_block::stitch_replica::end <= stitch::type_ids::gateway);

namespace stitch {

/// Whoever follows a replica's state (the gateway, status, the coordinator):
/// `(replica_state, info)` now and whenever readiness, the applied version
/// or the sync state change.
using replica_watcher_actor = caf::typed_actor<caf::reacts_to<atom::replica_state, replica_info>>;

/// REPLICA: one inference engine kept converged to its pool's pointer while it
/// serves (DESIGN §1, §2): reconcile, stage, commit, admission, stamping,
/// `server_info`.
using replica_actor = caf::typed_actor<
  // Serves a request of the replica's HTTP surface: a versioned route under
  // its constraint (the answer carries the stamps, or the 409/503/...), or a
  // route passed through to the engine (403 for its control routes). A
  // stream's events go to the sender as (event, key, json) first.
  caf::replies_to<atom::generate, replica_call>::with<replica_answer>,
  // The caller gave up on request `key` (client disconnect): abort it.
  caf::reacts_to<atom::cancel, uint64_t>,
  // Best-effort hint that the pointer moved: reconcile now.
  caf::reacts_to<atom::wake>,
  // Leave: out of rotation at once, refuse new requests (503, retryable),
  // quit when the running ones finished or `drain_timeout` passed. Carries
  // the member capability (refused without it).
  caf::reacts_to<atom::retire, std::string>,
  // DESIGN §5 `server_info`.
  caf::replies_to<atom::server_info>::with<replica_info>,
  // Sends `(replica_state, replica_info)` to the watcher now and whenever
  // readiness, the applied version or the sync state change (the gateway and
  // status route and report from these, never polling per request).
  caf::reacts_to<atom::subscribe, replica_watcher_actor>,
  // The store's pointer subscription.
  caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
  // A peer's lease on the version this replica holds, to read its bytes
  // (`not_found` when it holds another one or serves no peers); the peer
  // releases it when done (an unreleased lease expires). The offer names
  // the registered memory and its remote keys, so it needs the member
  // capability (last).
  // The bool asks for the frames of delta `version` it fetched instead.
  caf::replies_to<atom::offer, version_ref, bool, std::string>::with<peer_offer>,
  caf::reacts_to<atom::release, uint64_t>,
  // `stitch profile`. Begin: follow scratch pool `pool` instead of its own,
  // starting cold; refused while in rotation unless `take_out` (then out of
  // rotation at once, 503 to new requests). Answers once the running
  // requests finished and no pass runs. From then on it reconciles only when
  // told: (profile, target) runs one pass and answers how it reached the
  // target. (profile, done) goes back to its own pool and answers once a
  // pass there ended, back in rotation if it caught up.
  // Each carries the member capability last.
  caf::replies_to<atom::profile, std::string, bool, std::string>::with<replica_info>,
  caf::replies_to<atom::profile, version_ref, std::string>::with<profile_step>,
  caf::replies_to<atom::profile, atom::done, std::string>::with<replica_info>,
  // Internal: a profile step's checksum verdict (`id` names the step); the
  // profile's lease ran out unless renewed since (`lease` names the renewal).
  caf::reacts_to<atom::profile, uint64_t, profile_step>,
  caf::reacts_to<atom::profile, atom::tick, uint64_t>,
  // Internal: the backstop timer and the drain deadline.
  caf::reacts_to<atom::tick>, caf::reacts_to<atom::drain_check>,
  // Internal: reports of the replica's worker threads.
  caf::reacts_to<atom::staged, work_report>, caf::reacts_to<atom::committed, work_report>,
  caf::reacts_to<atom::rebuilt, work_report>,
  // Internal: the request lane left effects for the actor, or fell idle.
  caf::reacts_to<atom::lane_work>,
  caf::reacts_to<atom::generated, uint64_t, replica_answer, caf::error, caf::optional<uint64_t>>>;

/// Whoever lends a version's bytes to peers: a replica, or a publisher.
using peer_holder_actor =
  caf::typed_actor<caf::replies_to<atom::offer, version_ref, bool, std::string>::with<peer_offer>,
                   caf::reacts_to<atom::release, uint64_t>>;

/// Where holders that are not replicas (publishers) announce what they lend
/// (the coordinator's directory): (offer, pool, version, holder id, node,
/// handle, frames, member capability) when they hold a version in full
/// (false) or a delta's stored frames (true), (release, pool, holder id,
/// member capability) when they stop.
using holder_registry_actor =
  caf::typed_actor<caf::reacts_to<atom::offer, std::string, version_ref, std::string, std::string,
                                  peer_holder_actor, bool, std::string>,
                   caf::reacts_to<atom::release, std::string, std::string, std::string>>;

} // namespace stitch

namespace stitch {

/// A holder the coordinator's directory hands a receiver: a replica that
/// serves the version, or one still fetching it (`partial`), or a publisher.
struct holder_entry {
  std::string replica_id;
  std::string node;
  peer_holder_actor handle;
  /// Read only when every primary failed.
  bool backup = false;
  bool partial = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, holder_entry& x) {
  return f(caf::meta::type_name("stitch.holder_entry"), x.replica_id, x.node, x.handle, x.backup,
           x.partial);
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_replica_handles, caf::id_block::stitch_replica::end)
CAF_ADD_TYPE_ID(stitch_replica_handles, (stitch::replica_watcher_actor))
CAF_ADD_TYPE_ID(stitch_replica_handles, (stitch::peer_holder_actor))
CAF_ADD_TYPE_ID(stitch_replica_handles, (stitch::holder_registry_actor))
CAF_ADD_TYPE_ID(stitch_replica_handles, (stitch::holder_entry))
CAF_ADD_TYPE_ID(stitch_replica_handles, (std::vector<stitch::holder_entry>) )
CAF_END_TYPE_ID_BLOCK(stitch_replica_handles)

static_assert(caf::id_block::stitch_replica_handles::end <= stitch::type_ids::gateway);
