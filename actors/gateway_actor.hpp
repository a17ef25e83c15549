#pragma once

#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <vector>

#include "actors/replica_actor.hpp"

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

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, histogram& x) {
  return f(caf::meta::type_name("stitch.histogram"), x.bounds, x.counts, x.sum, x.count);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gateway_stats& x) {
  return f(caf::meta::type_name("stitch.gateway_stats"), x.latency_seconds, x.staleness_versions,
           x.codes, x.code_counts, x.retries_total, x.last_staleness);
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_gateway, ::stitch::type_ids::gateway)
CAF_ADD_TYPE_ID(stitch_gateway, (stitch::histogram))
CAF_ADD_TYPE_ID(stitch_gateway, (stitch::gateway_stats))
CAF_ADD_ATOM(stitch_gateway, stitch::atom, pool_view, "poolview")
CAF_ADD_ATOM(stitch_gateway, stitch::atom, stats, "stats")
CAF_END_TYPE_ID_BLOCK(stitch_gateway)

static_assert(caf::id_block::stitch_gateway::end <= stitch::type_ids::node_agent);

namespace stitch {

/// GATEWAY: the front door for rollout clients (DESIGN §2, §5): routes each
/// versioned request to a ready replica of its pool that satisfies the
/// constraint (least outstanding, session affinity), retries another on a
/// retryable 409/503, answers 409 itself when none can satisfy it.
using gateway_actor = caf::typed_actor<
  // Adds a replica to a pool (the gateway subscribes to its state). The last
  // string is the member capability (refused without it).
  caf::reacts_to<atom::enroll, std::string, replica_actor, std::string>,
  // Stops routing to a replica (the coordinator removed its node; the
  // gateway's own monitor may not fire when it reached the replica through
  // another node); with the member capability.
  caf::reacts_to<atom::retire, replica_actor, std::string>,
  // Serves a request for `pool` with session `session` (empty = none).
  caf::replies_to<atom::generate, std::string, std::string, replica_call>::with<replica_answer>,
  // The client of request `key` went away.
  caf::reacts_to<atom::cancel, uint64_t>,
  // Fans a wake out to every replica of `pool` (empty = every pool).
  caf::reacts_to<atom::wake, std::string>,
  // Every replica's last known state in `pool` (empty = every pool).
  caf::replies_to<atom::pool_view, std::string>::with<std::vector<replica_info>>,
  // Latency, staleness and answers by status code so far.
  caf::replies_to<atom::stats>::with<gateway_stats>,
  // From replicas: their state (from the enrolled replica only), streamed
  // events of requests in flight.
  caf::reacts_to<atom::replica_state, replica_info>,
  caf::reacts_to<atom::event, uint64_t, std::string>>;

} // namespace stitch
