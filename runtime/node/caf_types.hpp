#pragma once

// The CAF face of the domain types: the error category, `inspect` overloads and
// the type-ID block. Include only where CAF is used (actors/, runtime/node/).

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include "runtime/core/error.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/version_ref.hpp"

CAF_ERROR_CODE_ENUM(stitch::errc, "stitch")

namespace stitch {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, version_ref& x) {
  return f(caf::meta::type_name("stitch.version_ref"), x.run_id, x.version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pointer_record& x) {
  return f(caf::meta::type_name("stitch.pointer_record"), x.latest, x.boot_version);
}

/// A domain error as a CAF error: the code in category "stitch", the message
/// as context.
caf::error to_caf_error(const error& err);

/// Back from CAF: our own category keeps its code and message; anything else
/// becomes `backend_failure` with CAF's rendering of it.
error from_caf_error(const caf::actor_system& sys, const caf::error& err);

/// The actor system config every Stitch process uses: our message types and
/// the renderer of our error category.
class system_config : public caf::actor_system_config {
public:
  system_config();
};

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(stitch, (stitch::version_ref))
  CAF_ADD_TYPE_ID(stitch, (stitch::pointer_record))
CAF_END_TYPE_ID_BLOCK(stitch)
