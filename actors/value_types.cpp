#include "actors/value_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/message.hpp>

namespace stitch {

caf::error to_caf_error(const error& err) {
  return caf::make_error(err.code, err.message);
}

error from_caf_error(const caf::actor_system& sys, const caf::error& err) {
  if (!err)
    return {};
  if (err.category() == caf::atom("stitch")) {
    std::string message;
    const auto& ctx = err.context();
    if (ctx.match_elements<std::string>())
      message = ctx.get_as<std::string>(0);
    return error{static_cast<errc>(err.code()), std::move(message)};
  }
  return error{errc::backend_failure, sys.render(err)};
}

} // namespace stitch
