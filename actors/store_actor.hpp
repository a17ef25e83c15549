#pragma once

#include <caf/optional.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/value_types.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(stitch_store, ::stitch::type_ids::store)
CAF_ADD_TYPE_ID(stitch_store, (caf::optional<stitch::pointer_record>) )
CAF_ADD_TYPE_ID(stitch_store, (caf::optional<stitch::version_ref>) )
CAF_ADD_ATOM(stitch_store, stitch::atom, read_pointer, "readptr")
CAF_ADD_ATOM(stitch_store, stitch::atom, claim, "claim")
CAF_ADD_ATOM(stitch_store, stitch::atom, advance, "advance")
CAF_ADD_ATOM(stitch_store, stitch::atom, read_manifest, "readman")
CAF_ADD_ATOM(stitch_store, stitch::atom, read_range, "readrange")
CAF_ADD_ATOM(stitch_store, stitch::atom, list, "list")
CAF_ADD_ATOM(stitch_store, stitch::atom, retain, "retain")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_begin, "putbegin")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_shard, "putshard")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_chunk, "putchunk")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_end, "putend")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_abort, "putabort")
CAF_ADD_ATOM(stitch_store, stitch::atom, put_file, "putfile")
CAF_ADD_ATOM(stitch_store, stitch::atom, pointer_moved, "ptrmoved")
CAF_ADD_ATOM(stitch_store, stitch::atom, list_pools, "listpools")
CAF_ADD_ATOM(stitch_store, stitch::atom, export_to, "exportto")
CAF_END_TYPE_ID_BLOCK(stitch_store)

namespace stitch {

/// Whoever follows a pool's pointer (replicas, status): the store tells it
/// `(pointer_moved, pool, pointer)` after every move (best effort: reading
/// the pointer stays the truth).
using pointer_listener_actor =
  caf::typed_actor<caf::reacts_to<atom::pointer_moved, std::string, pointer_record>>;

/// STORE: the durable source of truth — version chains and pool pointers over
/// a backend (DESIGN §2). Its handlers never touch the backend: pointer,
/// manifest and listing calls run on a fast lane that bulk work (uploads'
/// shard bytes, exports, retention) can never delay, bulk work on a lane of
/// its own, and tensor range reads (replicas staging) on a third, so that no
/// publish's writes hold up another pool's sync;
/// every lane is bounded and a full one answers `busy` (retryable). Tensor
/// bytes leave in chunks of at most `max_chunk_bytes` and arrive the same way.
using store_actor = caf::typed_actor<
  // Reads a pool's pointer (none before a run is claimed).
  caf::replies_to<atom::read_pointer, std::string>::with<caf::optional<pointer_record>>,
  // Claims a run at its boot version (a stored full anchor). The last
  // string of every call that writes (claim, advance, retain, put_begin) is
  // the admin token, which a store with one requires.
  caf::replies_to<atom::claim, std::string, version_ref, std::string>::with<pointer_record>,
  // Moves a pool's pointer from `expected` to `proposed` (compare-and-swap).
  caf::replies_to<atom::advance, std::string, caf::optional<version_ref>, version_ref,
                  std::string>::with<pointer_record>,
  // Reads a published version's manifest.
  caf::replies_to<atom::read_manifest, std::string, version_ref>::with<manifest>,
  // Reads `len` (<= max_chunk_bytes) stored bytes of a tensor at `offset`.
  caf::replies_to<atom::read_range, std::string, version_ref, std::string, uint64_t,
                  uint64_t>::with<shared_piece>,
  // Lists a run's published versions.
  caf::replies_to<atom::list, std::string, std::string>::with<std::vector<version_ref>>,
  // The pools holding published versions of `run` (every pool when empty).
  caf::replies_to<atom::list_pools, std::string>::with<std::vector<std::string>>,
  // Writes version `ref` of `pool` as a Hugging Face directory at `path`
  // (absolute, on this node's machine; fsynced when `sync`); the last
  // string is the admin token, which a node with one requires.
  caf::replies_to<atom::export_to, std::string, version_ref, std::string, bool,
                  std::string>::with<bool>,
  // Applies retention to a pool (or says what it would do).
  caf::replies_to<atom::retain, std::string, retention_request,
                  std::string>::with<retention_report>,
  // Starts storing version `ref` of `pool`; answers an upload id, random
  // (the later calls of the upload name it: only its opener knows it).
  caf::replies_to<atom::put_begin, std::string, version_ref, std::string>::with<uint64_t>,
  // Starts the next shard of upload `id`: its name and size.
  caf::replies_to<atom::put_shard, uint64_t, std::string, uint64_t>::with<bool>,
  // The next bytes (<= max_chunk_bytes) of the current shard; answers the
  // bytes of the upload so far.
  caf::replies_to<atom::put_chunk, uint64_t, std::vector<char>>::with<uint64_t>,
  // One whole non-tensor file of upload `id` (<= max_version_file_bytes):
  // its name and bytes.
  caf::replies_to<atom::put_file, uint64_t, std::string, std::vector<char>>::with<bool>,
  // Ends upload `id`: checks it against the manifest and stores it durably.
  caf::replies_to<atom::put_end, uint64_t, manifest>::with<bool>,
  // Drops upload `id` and what it wrote (its writer gave up).
  caf::reacts_to<atom::put_abort, uint64_t>,
  // Tells `listener` of every pointer move in `pool` (in every pool when
  // `pool` is empty: pool names never are).
  caf::reacts_to<atom::subscribe, std::string, pointer_listener_actor>,
  // INTERNAL: the backend moved the pointer of a pool (for this actor or
  // for a writer on its node): the listeners are told.
  caf::reacts_to<atom::pointer_moved, std::string, pointer_record>,
  // INTERNAL: a lane finished job `id`; the idle-upload sweep.
  caf::reacts_to<atom::done, uint64_t>, caf::reacts_to<atom::tick>>;

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_store_handles, caf::id_block::stitch_store::end)
CAF_ADD_TYPE_ID(stitch_store_handles, (stitch::store_actor))
CAF_ADD_TYPE_ID(stitch_store_handles, (stitch::pointer_listener_actor))
CAF_END_TYPE_ID_BLOCK(stitch_store_handles)

static_assert(caf::id_block::stitch_store_handles::end <= stitch::type_ids::publisher);
