#pragma once

#include <caf/actor_system_config.hpp>

namespace stitch {

/// Registers Stitch's message types and the renderer of its error category.
void register_stitch_types(caf::actor_system_config& cfg);

/// The actor system config every Stitch process uses: our types, and the
/// middleman for remote actors.
class system_config : public caf::actor_system_config {
public:
  system_config();
};

} // namespace stitch
