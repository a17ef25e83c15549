#pragma once

#include <caf/optional.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/replica_actor.hpp"
#include "actors/value_types.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/pipeline/publish_types.hpp"
#include "runtime/pipeline/tensor_stream.hpp"

namespace stitch {

/// What `stitch publish` asks for (DESIGN §7).
/// A publish as it travels to a publisher: the pipeline's request (a
/// streamed publish's non-tensor files in `files`; a directory the node
/// reads brings its own) and the caller's admin token. A publisher answers
/// the pipeline's `publish_report`.
struct publish_args : pipeline::publish_request {
  /// The admin token, when the node requires one.
  std::string token;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, publish_args& x) {
  return f(caf::meta::type_name("stitch.publish_args"), x.pool, x.run_id, x.version, x.force_anchor,
           x.dry_run, x.token, x.files);
}

namespace pipeline {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, publish_report& x) {
  optional_proxy<pointer_record> pointer{x.pointer};
  return f(caf::meta::type_name("stitch.publish_report"), x.kind, x.touched, x.raw_bytes,
           x.encoded_bytes, x.stored_bytes, x.idempotent, x.claimed, pointer.field,
           x.reason_for_anchor, x.published, pointer.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_header& x) {
  return f(caf::meta::type_name("stitch.tensor_header"), x.name, x.type, x.shape, x.size);
}

} // namespace pipeline

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_publisher, ::stitch::type_ids::publisher)
CAF_ADD_TYPE_ID(stitch_publisher, (stitch::publish_args))
CAF_ADD_TYPE_ID(stitch_publisher, (stitch::pipeline::publish_report))
CAF_ADD_TYPE_ID(stitch_publisher, (stitch::pipeline::tensor_header))
CAF_ADD_TYPE_ID(stitch_publisher, (std::vector<stitch::pipeline::tensor_header>) )
CAF_ADD_ATOM(stitch_publisher, stitch::atom, publish, "pubstart")
CAF_ADD_ATOM(stitch_publisher, stitch::atom, init_model, "initmodel")
CAF_ADD_ATOM(stitch_publisher, stitch::atom, chunk, "chunk")
CAF_ADD_ATOM(stitch_publisher, stitch::atom, finish, "finish")
CAF_ADD_ATOM(stitch_publisher, stitch::atom, abort, "abort")
CAF_ADD_ATOM(stitch_publisher, stitch::atom, collect, "collect")
CAF_END_TYPE_ID_BLOCK(stitch_publisher)

namespace stitch {

/// PUBLISHER: turns a trainer's full weights into versions in the store —
/// delta against the last version it remembers, checksums, publish, pointer
/// move (DESIGN §2, §7 `stitch publish`). Publishes run on worker threads,
/// one at a time per pool; its handlers only hand work over.
/// The pieces `stitch publish --stream` sends: small, so that each takes a
/// short share of the receiving node's network thread (pointer reads and
/// requests share it). A session opens with that many pieces' buffers
/// warmed up (up to the publisher's queue).
inline constexpr size_t streamed_piece_bytes = size_t{1} << 20;

using publisher_actor = caf::typed_actor<
  // Publishes the Hugging Face directory at `path` (readable by this node).
  caf::replies_to<atom::publish, publish_args, std::string>::with<pipeline::publish_report>,
  // Publishes the built-in model `preset` initialised from `seed` (an
  // experiment's boot checkpoint; deterministic, so a trainer rebuilds the
  // same weights and re-publishing them is idempotent).
  caf::replies_to<atom::init_model, publish_args, std::string,
                  uint64_t>::with<pipeline::publish_report>,
  // Opens a streamed publish of these tensors (ascending names); answers a
  // session id. Their bytes follow with `chunk`, tensor after tensor.
  caf::replies_to<atom::publish, publish_args,
                  std::vector<pipeline::tensor_header>>::with<uint64_t>,
  // The next bytes (at most `max_chunk_bytes`; `stitch publish --stream`
  // sends `streamed_piece_bytes`) of session `id`, answered
  // once the publish consumed them (the window a client keeps in flight is
  // all the memory it holds here) with the bytes the session still expects.
  // From another process they arrive in pooled buffers; in this one (an
  // HTTP body) they stay where they are.
  caf::replies_to<atom::chunk, uint64_t, shared_piece>::with<uint64_t>,
  // Ends session `id`: answers what was published.
  caf::replies_to<atom::finish, uint64_t>::with<pipeline::publish_report>,
  // Gives session `id` up: nothing of it becomes visible.
  caf::reacts_to<atom::abort, uint64_t>,
  // `stitch gc`: applies retention to `pool` (empty = every pool) keeping the
  // newest `keep` versions of each run (0 = `store.retain_versions`), every
  // chain they need, the boot and what replicas use; a dry run only
  // reports. The last string is the admin token (a dry run needs none).
  caf::replies_to<atom::collect, std::string, uint32_t, bool, std::string>::with<retention_report>,
  // Drops runs of `pool` entirely (every version, the boot included) unless
  // the pointer or a replica uses one of theirs: `stitch profile`'s scratch
  // runs. The last string is the admin token.
  caf::replies_to<atom::collect, std::string, std::vector<std::string>,
                  std::string>::with<retention_report>,
  // A peer's lease on a run's remembered version (the bool false) or on the
  // stored frames of its newest delta (true), which the publisher lends (peer
  // transfer; `not_found` for any other); released when read.
  caf::replies_to<atom::offer, version_ref, bool, std::string>::with<peer_offer>,
  // The URL of this publisher's HTTP surface (`publisher.listen`, its host
  // as configured, a wildcard included), "" when it has none: `stitch
  // publish --stream` sends its bytes there when it can reach it.
  caf::replies_to<atom::server_info>::with<std::string>,
  // Sets that URL (the node, once the surface listens).
  caf::reacts_to<atom::server_info, std::string>, caf::reacts_to<atom::release, uint64_t>,
  // INTERNAL: a worker finished job `id`; the idle-session sweep.
  caf::reacts_to<atom::done, uint64_t>, caf::reacts_to<atom::tick>>;

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_publisher_handles, caf::id_block::stitch_publisher::end)
CAF_ADD_TYPE_ID(stitch_publisher_handles, (stitch::publisher_actor))
CAF_END_TYPE_ID_BLOCK(stitch_publisher_handles)

static_assert(caf::id_block::stitch_publisher_handles::end <= stitch::type_ids::end);
