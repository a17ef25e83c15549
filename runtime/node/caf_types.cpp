#include "runtime/node/caf_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
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

system_config::system_config() {
  add_message_types<caf::id_block::stitch>();
  add_error_category(caf::atom("stitch"), [](uint8_t code, caf::atom_value,
                                             const caf::message& ctx) -> std::string {
    std::string out = "stitch::";
    out += to_string(static_cast<errc>(code));
    if (ctx.match_elements<std::string>()) {
      out += ": ";
      out += ctx.get_as<std::string>(0);
    }
    return out;
  });
  load<caf::io::middleman>();
}

} // namespace stitch
