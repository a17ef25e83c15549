#include "actors/coordinator.hpp"

#include <caf/all.hpp>

namespace stitch {

coordinator_actor::behavior_type
coordinator(coordinator_actor::stateful_pointer<coordinator_state> self) {
  self->set_down_handler([self](const caf::down_msg& down) {
    std::erase_if(self->state.roles,
                  [&](const auto& kv) { return kv.second.address() == down.source; });
  });
  return {
    [self](atom::lookup, const std::string& role) -> caf::result<caf::actor> {
      auto it = self->state.roles.find(role);
      if (it == self->state.roles.end())
        return to_caf_error({errc::not_found, "no actor serves the role '" + role + "'"});
      return it->second;
    },
    [self](atom::enroll, const std::string& role, const caf::actor& handle) {
      self->monitor(handle);
      self->state.roles[role] = handle;
    },
  };
}

} // namespace stitch
