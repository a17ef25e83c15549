#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace stitch {

/// STORE: the durable source of truth — version chains and pool pointers over
/// a backend (DESIGN §2). Tensor bytes leave it in chunks of at most
/// `max_chunk_bytes`; shards arrive the same way.
using store_actor = caf::typed_actor<
  // Reads a pool's pointer.
  caf::replies_to<atom::read_pointer, std::string>::with<pointer_reply>,
  // Claims a run at its boot version (a stored full anchor).
  caf::replies_to<atom::claim, std::string, version_ref>::with<pointer_record>,
  // Moves a pool's pointer from `expected` to `proposed` (compare-and-swap).
  caf::replies_to<atom::advance, std::string, pointer_reply, version_ref>::with<pointer_record>,
  // Reads a published version's manifest (the index JSON).
  caf::replies_to<atom::read_manifest, std::string, version_ref>::with<std::string>,
  // Reads `len` (<= max_chunk_bytes) stored bytes of a tensor at `offset`.
  caf::replies_to<atom::read_range, std::string, version_ref, std::string, uint64_t,
                  uint64_t>::with<std::vector<char>>,
  // Lists a run's published versions.
  caf::replies_to<atom::list, std::string, std::string>::with<std::vector<version_ref>>,
  // Applies retention (keep_last) to a pool; answers the deleted and kept versions.
  caf::replies_to<atom::retain, std::string, uint64_t>::with<std::vector<version_ref>,
                                                             std::vector<version_ref>>,
  // Starts storing a version (pool, manifest JSON); answers an upload id.
  caf::replies_to<atom::put_begin, std::string, std::string>::with<uint64_t>,
  // Appends the next bytes of a shard of upload `id`.
  caf::replies_to<atom::put_chunk, uint64_t, std::string, std::vector<char>>::with<uint64_t>,
  // Ends upload `id`: validates and stores the version durably.
  caf::replies_to<atom::put_end, uint64_t>::with<bool>,
  // Sends `(pointer_moved, pool, pointer_record)` to `subscriber` on changes
  // (best effort: the pointer read stays the truth).
  caf::reacts_to<atom::subscribe, std::string, caf::actor>,
  // The pointer of a pool may have moved (someone wrote the backend directly).
  caf::reacts_to<atom::notify, std::string>>;

} // namespace stitch
