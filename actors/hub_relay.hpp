#pragma once

// A node's stand-in for an actor of the hub (the coordinator, the store): the
// node's replicas, gateway, status, publisher and trainers hold the relay's
// handle, and the relay delegates every message to the hub actor it points
// at now (sender and request id kept, so answers go straight back). When the
// hub's node dies and comes back, the relay is pointed at the new actor and
// nothing that holds its handle changes. While it points at nothing, requests
// are answered at once with an error naming the role (callers retry as they
// would after a timeout); plain messages are dropped.
//
// A request the hub actor never answers because its node died (CAF answers
// nothing across a lost connection; the caller would wait out its own
// timeout, 30 s for a replica) is answered by a relay with `own_requests`:
// it sends such requests itself, passes the answer on, and answers every
// request still out with a retryable error the moment its target goes down.
// A node's two relays (`coordinator_relay_options`, `store_relay_options`)
// both do, and so does the one `stitch publish --stream` sends its chunks
// through (a node that dies mid-publish fails the CLI at once).

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace stitch {

struct hub_relay_options {
  /// For errors and logs ("coordinator", "store").
  std::string role;
  /// When set: whenever the relay has no live target it asks this actor for
  /// `(lookup, role)` (retrying every half second) and points at the answer.
  /// Without it the target comes from `(rebind, actor)` only.
  caf::actor directory;
  /// Messages the relay remembers and replays, with their senders, to each
  /// new target (the store's pointer subscriptions); dropped when their
  /// sender is gone.
  std::function<bool(const caf::message&)> sticky;
  /// Requests go out as the relay's own and their answers come back through
  /// it, so that a target that dies leaves none of them unanswered. The
  /// target then sees the relay as the sender of requests (plain messages
  /// keep theirs): only for hub actors whose request handlers do not look at
  /// who asks. The store's do not; the coordinator's heartbeats and `trained`,
  /// which it checks by sender, come from the node agent, which holds the
  /// coordinator itself, not the relay.
  bool own_requests = false;
  /// With `own_requests`: how long the relay waits for an answer before it
  /// forgets the request (answering it with CAF's request timeout).
  std::chrono::milliseconds request_bound{std::chrono::minutes{10}};
};

/// A relay for `role` that owns its requests (`own_requests`), nothing else:
/// what a process puts between itself and an actor on another node so that
/// a node or connection that dies leaves no request unanswered (the CLI's
/// link to a publisher or a store).
hub_relay_options owning_relay_options(std::string role);

/// A node's relay to the coordinator: role lookups, the holders of a
/// version, the retention directory (`in_use`), enrollments and replica
/// states; requests owned.
hub_relay_options coordinator_relay_options();

/// A node's relay to the store: found again through `directory` (the node's
/// coordinator relay), replays the replicas' pointer subscriptions to a new
/// store; requests owned (a replica's pointer read out when the hub's node
/// died held its reconcile for 30 s: tests/chaos, seed 6).
hub_relay_options store_relay_options(caf::actor directory);

/// Spawns a relay pointing at `target` (may be null). `(rebind, actor)` from
/// an actor of this node points it elsewhere (null: at nothing).
caf::actor spawn_hub_relay(caf::actor_system& sys, hub_relay_options opts, caf::actor target);

/// Points `relay` at `target` (null: at nothing).
void rebind_hub_relay(const caf::actor& relay, const caf::actor& target);

} // namespace stitch
