#pragma once

// The CAF face of the domain's shared values: the `stitch` error category,
// `inspect` for the value types several roles exchange (version refs,
// pointers, manifests, retention reports), the atoms every role uses, and
// their type-ID block. Included by actor interfaces and implementations only.

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/optional.hpp>
#include <caf/replies_to.hpp>
#include <caf/sec.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "actors/type_id_ranges.hpp"
#include "runtime/core/admission_gate.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/core/version_ref.hpp"

CAF_ERROR_CODE_ENUM(stitch::errc, "stitch")

namespace stitch {

/// A domain error as a CAF error: the code in category "stitch", the message
/// as context.
caf::error to_caf_error(const error& err);

/// Back from CAF: our own category keeps its code and message; anything else
/// becomes `backend_failure` with CAF's rendering of it.
error from_caf_error(const caf::actor_system& sys, const caf::error& err);

/// Largest byte payload one message carries (shard and tensor bytes travel
/// in chunks of at most this; control messages never carry whole tensors).
inline constexpr uint64_t max_chunk_bytes = uint64_t{8} << 20;

/// Bytes that an object already holds (an HTTP request's body, a pooled
/// buffer a client filled): handed to an actor in the same process without a
/// copy. Across nodes it travels as its bytes (the wire format of a byte
/// sequence), and arrives in a buffer of the piece pool, at most
/// `max_chunk_bytes` (a longer one is refused before anything is allocated).
struct shared_piece {
  /// Keeps `data` alive.
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  uint64_t size = 0;
};

/// An uninitialized buffer of `size` bytes (at most `max_chunk_bytes`) for a
/// piece, from a process-wide pool: when the last copy of `owner` goes, the
/// buffer goes back to the pool (which keeps at most 64 MiB of them) instead
/// of to the system. Streams of pieces (a client's publish, the node taking
/// them in) reuse warm memory instead of faulting in and zeroing fresh pages
/// for every piece.
struct piece_buffer {
  std::shared_ptr<const void> owner;
  char* data = nullptr;
  size_t size = 0;

  /// The first `n` bytes (filled) as a piece, sharing the buffer.
  shared_piece share(size_t n) const { return shared_piece{owner, data, n}; }
};
result<piece_buffer> take_piece_buffer(size_t size);

/// Puts `count` buffers of `size` bytes in the piece pool (within its 64 MiB)
/// with every page faulted in: a node that is about to take a stream of
/// pieces does this on a bulk thread first, so that its network thread copies
/// the first pieces into warm memory instead of faulting in fresh pages for
/// each (on a virtual machine that backs memory lazily, about 1 ms per MiB,
/// during which the other connections wait).
void warm_piece_buffers(size_t count, size_t size);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shared_piece& x) {
  if constexpr (!std::is_same_v<typename Inspector::result_type, caf::error>) {
    // Rendering (to_string): the size only.
    return f(caf::meta::type_name("stitch.shared_piece"), x.size);
  } else if constexpr (Inspector::reads_state) {
    size_t n = x.owner && x.data ? static_cast<size_t>(x.size) : 0;
    return caf::error::eval(
      [&] { return f.begin_sequence(n); },
      [&] { return n > 0 ? f.apply_raw(n, const_cast<char*>(x.data)) : caf::none; },
      [&] { return f.end_sequence(); });
  } else {
    size_t n = 0;
    if (auto err = f.begin_sequence(n))
      return err;
    auto buffer = take_piece_buffer(n);
    if (!buffer)
      return to_caf_error(buffer.error());
    if (n > 0)
      if (auto err = f.apply_raw(n, buffer->data))
        return err;
    x = buffer->share(n);
    return f.end_sequence();
  }
}

/// `inspect` of a `std::optional` member (CAF 0.17 knows only its own
/// optional) as a list of none or one value: `field` is filled before
/// saving, and `commit` writes it back after loading, refusing a longer
/// list. (A `caf::optional` here left GCC 12 at -O3 seeing its empty storage
/// read when stringified: -Wmaybe-uninitialized.)
template <class T>
struct optional_proxy {
  explicit optional_proxy(std::optional<T>& x) : target(x) {
    if (x)
      field.push_back(*x);
  }
  auto commit() {
    return caf::meta::load_callback([this]() -> caf::error {
      if (field.size() > 1)
        return caf::sec::invalid_argument;
      target = field.empty() ? std::nullopt : std::optional<T>{std::move(field.front())};
      return caf::none;
    });
  }
  std::optional<T>& target;
  std::vector<T> field;
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
typename Inspector::result_type inspect(Inspector& f, tensor_spec_entry& x) {
  return f(caf::meta::type_name("stitch.tensor_spec"), x.dtype, x.shape);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, file_entry& x) {
  return f(caf::meta::type_name("stitch.file_entry"), x.size, x.checksum);
}

/// A manifest crosses actor boundaries as a value; receivers from other
/// nodes still `validate` it like any untrusted input.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, manifest& x) {
  optional_proxy<uint64_t> base{x.base_version};
  return f(caf::meta::type_name("stitch.manifest"), x.ref, x.kind, base.field, x.encoding, x.comp,
           x.checksum_algorithm, x.touched, x.total_size, x.shards, x.weight_map, x.checksums,
           x.tensor_specs, x.files, x.frames, base.commit());
}

/// A request's constraint, parsed once at the HTTP surface that received it
/// (`strip_constraint`, `constraint_from_headers`, `merge`): every actor
/// after it receives it typed.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, constraint& x) {
  optional_proxy<uint64_t> min{x.min_version};
  optional_proxy<uint64_t> exact{x.exact_version};
  return f(caf::meta::type_name("stitch.constraint"), min.field, exact.field, min.commit(),
           exact.commit());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stamps& x) {
  return f(caf::meta::type_name("stitch.stamps"), x.start, x.end);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, retention_request& x) {
  return f(caf::meta::type_name("stitch.retention_request"), x.keep_last, x.in_use, x.dry_run);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, retention_entry& x) {
  return f(caf::meta::type_name("stitch.retention_entry"), x.ref, x.why, x.needed_by);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, retention_report& x) {
  return f(caf::meta::type_name("stitch.retention_report"), x.deleted, x.kept);
}

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_values, ::stitch::type_ids::values)
CAF_ADD_TYPE_ID(stitch_values, (stitch::version_ref))
CAF_ADD_TYPE_ID(stitch_values, (std::vector<stitch::version_ref>) )
CAF_ADD_TYPE_ID(stitch_values, (stitch::pointer_record))
CAF_ADD_TYPE_ID(stitch_values, (stitch::manifest))
CAF_ADD_TYPE_ID(stitch_values, (stitch::constraint))
CAF_ADD_TYPE_ID(stitch_values, (stitch::stamps))
CAF_ADD_TYPE_ID(stitch_values, (stitch::retention_request))
CAF_ADD_TYPE_ID(stitch_values, (stitch::retention_report))
CAF_ADD_TYPE_ID(stitch_values, (std::vector<uint64_t>) )
CAF_ADD_TYPE_ID(stitch_values, (std::vector<char>) )
CAF_ADD_TYPE_ID(stitch_values, (stitch::shared_piece))
CAF_ADD_TYPE_ID(stitch_values, (std::vector<std::string>) )
CAF_ADD_TYPE_ID(stitch_values, (std::vector<uint32_t>) )
// A worker finished job `id` of its actor (see `actors/offload.hpp`).
CAF_ADD_ATOM(stitch_values, stitch::atom, done, "done")
CAF_ADD_ATOM(stitch_values, stitch::atom, subscribe, "stsub")
CAF_ADD_ATOM(stitch_values, stitch::atom, tick, "tick")
CAF_ADD_ATOM(stitch_values, stitch::atom, in_use, "inuse")
// The coordinator's directory of roles: who serves a role, and enrolling in one.
CAF_ADD_ATOM(stitch_values, stitch::atom, lookup, "lookup")
CAF_ADD_ATOM(stitch_values, stitch::atom, enroll, "enroll")
CAF_END_TYPE_ID_BLOCK(stitch_values)

static_assert(caf::id_block::stitch_values::end <= stitch::type_ids::cluster);

namespace stitch {

/// Who knows which versions replicas use (the coordinator): retention asks
/// it before deleting anything.
using version_directory_actor =
  caf::typed_actor<caf::replies_to<atom::in_use, std::string>::with<std::vector<version_ref>>>;

} // namespace stitch
