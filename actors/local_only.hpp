#pragma once

// Messages only a node's own code may send to its actors.

#include <caf/actor_control_block.hpp>
#include <caf/node_id.hpp>

namespace stitch {

/// Whether the message being handled came from an actor of this node.
/// Control messages that only the node's own code sends (where its
/// publisher's HTTP surface listens, a relay's target) check it, and their
/// senders send from an actor (a `scoped_actor`), not anonymously: a message
/// from another node may arrive without a sender too, so no sender is not
/// proof of a local one.
template <class Self>
bool from_this_node(Self* self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() == self->node();
}

} // namespace stitch
