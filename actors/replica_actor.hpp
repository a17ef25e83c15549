#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"
#include "actors/store_actor.hpp"

namespace stitch {

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
  // quit when the running ones finished or `drain_timeout` passed.
  caf::reacts_to<atom::retire>,
  // DESIGN §5 `server_info`.
  caf::replies_to<atom::server_info>::with<replica_info>,
  // Sends `(replica_state, replica_info)` to the subscriber now and whenever
  // readiness, the applied version or the sync state change (the gateway and
  // status route and report from these, never polling per request).
  caf::reacts_to<atom::subscribe, caf::actor>,
  // The store's pointer subscription.
  caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
  // Internal: the backstop timer and the drain deadline.
  caf::reacts_to<atom::tick>, caf::reacts_to<atom::drain_check>,
  // Internal: reports of the replica's worker threads.
  caf::reacts_to<atom::staged, work_report>, caf::reacts_to<atom::committed, work_report>,
  caf::reacts_to<atom::rebuilt, work_report>,
  caf::reacts_to<atom::generated, uint64_t, replica_answer>>;

} // namespace stitch
