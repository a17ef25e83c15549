#pragma once

#include <caf/actor_system_config.hpp>

namespace stitch {

/// The actor system config every Stitch process uses: our message types, the
/// renderer of our error category, and the middleman for remote actors.
class system_config : public caf::actor_system_config {
public:
  system_config();
};

} // namespace stitch
