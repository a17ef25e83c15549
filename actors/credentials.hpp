#pragma once

// What actors check before they act on a message from the cluster: the
// member capability on membership, placement and directory messages
// (docs/security.md), and that internal messages came from the actor itself.

#include <caf/actor_control_block.hpp>
#include <caf/send.hpp>

#include <string>
#include <string_view>

#include "actors/log.hpp"
#include "actors/value_types.hpp"
#include "runtime/core/token.hpp"

namespace stitch {

/// Whether `presented` is the member capability `expected` (constant time;
/// an empty `expected` admits everyone, as a cluster without a token does).
/// A refusal is logged, naming `role` and `what` was refused, never the
/// capability.
inline bool member_admits(std::string_view role, std::string_view expected,
                          std::string_view presented, std::string_view what) {
  if (token_matches(expected, presented))
    return true;
  log::warn(role, "refused " + std::string{what}
                    + ": the message did not carry the cluster's member capability");
  return false;
}

/// The refusal of a request without the member capability.
inline caf::error not_a_member(std::string_view what) {
  return to_caf_error(
    {errc::unauthorized, std::string{what}
                           + " needs the cluster's member capability (admin.token "
                             "or admin.member_token)"});
}

/// Whether the message being handled was sent by the actor itself (its
/// timers): such messages are no part of its interface to others.
template <class Self>
bool from_itself(Self* self) {
  return self->current_sender() && self->current_sender().get() == self->ctrl();
}

/// Sends an actor's worker thread's report to the actor as from the actor
/// itself, so that its handler can tell it from a message of anyone else's
/// (`from_itself`).
template <class Handle, class... Ts>
void send_to_itself(const Handle& handle, Ts&&... xs) {
  caf::send_as(handle, handle, std::forward<Ts>(xs)...);
}

} // namespace stitch
