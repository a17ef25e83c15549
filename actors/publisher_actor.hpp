#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace stitch {

/// PUBLISHER: turns a trainer's full weights into versions in the store —
/// delta against the last version it holds in memory, checksums, publish,
/// pointer move (DESIGN §2, §7 `stitch publish`).
using publisher_actor = caf::typed_actor<
  // Publishes the Hugging Face directory at `path` (readable by this node).
  caf::replies_to<atom::publish, publish_args, std::string>::with<publish_summary>,
  // Publishes the built-in model `preset` initialised from `seed` (an
  // experiment's boot checkpoint; deterministic, so a trainer rebuilds the
  // same weights and re-publishing them is idempotent).
  caf::replies_to<atom::init_model, publish_args, std::string, uint64_t>::with<publish_summary>,
  // Starts a streamed publish; answers a session id.
  caf::replies_to<atom::publish, publish_args>::with<uint64_t>,
  // Starts the next tensor of a session: name, dtype, shape; answers its byte size.
  caf::replies_to<atom::tensor, uint64_t, std::string, std::string,
                  std::vector<uint64_t>>::with<uint64_t>,
  // Appends up to `max_chunk_bytes` to the session's current tensor;
  // answers the bytes it still expects.
  caf::replies_to<atom::chunk, uint64_t, std::vector<char>>::with<uint64_t>,
  // Ends a session and publishes what it received.
  caf::replies_to<atom::finish, uint64_t>::with<publish_summary>>;

} // namespace stitch
