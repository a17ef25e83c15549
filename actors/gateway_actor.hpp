#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"
#include "actors/replica_actor.hpp"

namespace stitch {

/// GATEWAY: the front door for rollout clients (DESIGN §2, §5): routes each
/// versioned request to a ready replica of its pool that satisfies the
/// constraint (least outstanding, session affinity), retries another on a
/// retryable 409/503, answers 409 itself when none can satisfy it.
using gateway_actor = caf::typed_actor<
  // Adds a replica to a pool (the gateway subscribes to its state).
  caf::reacts_to<atom::enroll, std::string, replica_actor>,
  // Stops routing to a replica (the coordinator removed its node; the
  // gateway's own monitor may not fire when it reached the replica through
  // another node).
  caf::reacts_to<atom::retire, replica_actor>,
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
  // From replicas: their state, streamed events of requests in flight.
  caf::reacts_to<atom::replica_state, replica_info>,
  caf::reacts_to<atom::event, uint64_t, std::string>>;

} // namespace stitch
