#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <map>
#include <string>

#include "actors/coordinator_actor.hpp"

namespace stitch {

struct coordinator_state {
  static inline const char* name = "coordinator";
  std::map<std::string, caf::actor> roles;
};

coordinator_actor::behavior_type
coordinator(coordinator_actor::stateful_pointer<coordinator_state> self);

} // namespace stitch
