#pragma once

// The CAF face of the domain: the `stitch` error category, the atoms and
// message types of every actor interface, and their `inspect` overloads.
// Included by actor interfaces and implementations only.

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/version_ref.hpp"

CAF_ERROR_CODE_ENUM(stitch::errc, "stitch")

namespace stitch {

/// A pool's pointer, or none (no run claimed).
struct pointer_reply {
  bool present = false;
  pointer_record record;
};

/// What `stitch publish` asks for (DESIGN §7).
struct publish_args {
  std::string pool = "default";
  std::string run_id;
  uint64_t version = 0;
  bool force_anchor = false;
  bool dry_run = false;
};

/// What a publish did.
struct publish_summary {
  std::string kind;
  std::vector<std::string> touched;
  uint64_t raw_bytes = 0;
  uint64_t encoded_bytes = 0;
  uint64_t stored_bytes = 0;
  bool idempotent = false;
  bool claimed = false;
  pointer_reply pointer;
  std::string reason_for_anchor;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, version_ref& x) {
  return f(caf::meta::type_name("stitch.version_ref"), x.run_id, x.version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pointer_record& x) {
  return f(caf::meta::type_name("stitch.pointer_record"), x.latest, x.boot_version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pointer_reply& x) {
  return f(caf::meta::type_name("stitch.pointer_reply"), x.present, x.record);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, publish_args& x) {
  return f(caf::meta::type_name("stitch.publish_args"), x.pool, x.run_id, x.version, x.force_anchor,
           x.dry_run);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, publish_summary& x) {
  return f(caf::meta::type_name("stitch.publish_summary"), x.kind, x.touched, x.raw_bytes,
           x.encoded_bytes, x.stored_bytes, x.idempotent, x.claimed, x.pointer,
           x.reason_for_anchor);
}

/// A domain error as a CAF error: the code in category "stitch", the message
/// as context.
caf::error to_caf_error(const error& err);

/// Back from CAF: our own category keeps its code and message; anything else
/// becomes `backend_failure` with CAF's rendering of it.
error from_caf_error(const caf::actor_system& sys, const caf::error& err);

/// Largest byte payload one message carries (shard and tensor bytes travel
/// in chunks of at most this; control messages never carry whole tensors).
inline constexpr uint64_t max_chunk_bytes = uint64_t{8} << 20;

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(stitch, (stitch::version_ref))
CAF_ADD_TYPE_ID(stitch, (stitch::pointer_record))
CAF_ADD_TYPE_ID(stitch, (stitch::pointer_reply))
CAF_ADD_TYPE_ID(stitch, (stitch::publish_args))
CAF_ADD_TYPE_ID(stitch, (stitch::publish_summary))
CAF_ADD_TYPE_ID(stitch, (std::vector<stitch::version_ref>) )
CAF_ADD_TYPE_ID(stitch, (std::vector<uint64_t>) )
CAF_ADD_TYPE_ID(stitch, (std::vector<char>) )
CAF_ADD_TYPE_ID(stitch, (std::vector<std::string>) )
CAF_ADD_ATOM(stitch, stitch::atom, read_pointer, "readptr")
CAF_ADD_ATOM(stitch, stitch::atom, claim, "claim")
CAF_ADD_ATOM(stitch, stitch::atom, advance, "advance")
CAF_ADD_ATOM(stitch, stitch::atom, read_manifest, "readman")
CAF_ADD_ATOM(stitch, stitch::atom, read_range, "readrange")
CAF_ADD_ATOM(stitch, stitch::atom, list, "list")
CAF_ADD_ATOM(stitch, stitch::atom, retain, "retain")
CAF_ADD_ATOM(stitch, stitch::atom, put_begin, "putbegin")
CAF_ADD_ATOM(stitch, stitch::atom, put_chunk, "putchunk")
CAF_ADD_ATOM(stitch, stitch::atom, put_end, "putend")
CAF_ADD_ATOM(stitch, stitch::atom, subscribe, "stsub")
CAF_ADD_ATOM(stitch, stitch::atom, pointer_moved, "ptrmoved")
CAF_ADD_ATOM(stitch, stitch::atom, notify, "notify")
CAF_ADD_ATOM(stitch, stitch::atom, publish, "pubstart")
CAF_ADD_ATOM(stitch, stitch::atom, tensor, "tensor")
CAF_ADD_ATOM(stitch, stitch::atom, chunk, "chunk")
CAF_ADD_ATOM(stitch, stitch::atom, finish, "finish")
CAF_ADD_ATOM(stitch, stitch::atom, lookup, "lookup")
CAF_ADD_ATOM(stitch, stitch::atom, enroll, "enroll")
CAF_END_TYPE_ID_BLOCK(stitch)
