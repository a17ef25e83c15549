#pragma once

// Shared by the actor tests: CAF's deterministic scheduler, and a scripted
// replica that stands in for a real one where only its protocol matters.

#include <caf/actor_system_config.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <functional>
#include <vector>

#include "actors/replica_actor.hpp"
#include "node/system_config.hpp"

namespace stitch::testing {

/// Stitch's types, the testing scheduler (the test runs every message), no log file.
inline caf::actor_system_config& deterministic(caf::actor_system_config& cfg) {
  register_stitch_types(cfg);
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

struct scripted_replica_state {
  replica_info info;
  /// Requests the script kept unanswered.
  std::vector<caf::typed_response_promise<replica_answer>> held;
};

using scripted_replica_ptr = replica_actor::stateful_pointer<scripted_replica_state>;
/// How a scripted replica answers `generate` (default: an empty 200).
using generate_script =
  std::function<caf::result<replica_answer>(scripted_replica_ptr, replica_call&)>;

/// A replica that reports `info` to every watcher at once, answers
/// `server_info` with it, answers requests by `script`, tells `on_cancel` of
/// cancels and leaves when asked to retire. Everything else it ignores.
inline replica_actor::behavior_type scripted_replica(scripted_replica_ptr self, replica_info info,
                                                     generate_script script = {},
                                                     std::function<void(uint64_t)> on_cancel = {}) {
  self->state.info = std::move(info);
  return {
    [self, script](atom::generate, replica_call& call) -> caf::result<replica_answer> {
      if (script)
        return script(self, call);
      return replica_answer{};
    },
    [on_cancel](atom::cancel, uint64_t key) {
      if (on_cancel)
        on_cancel(key);
    },
    [](atom::wake) {},
    [self](atom::retire, const std::string&) { self->quit(); },
    [self](atom::server_info) { return self->state.info; },
    [self](atom::subscribe, replica_watcher_actor& who) {
      caf::send_as(caf::actor_cast<caf::actor>(self), who, atom::replica_state_v, self->state.info);
    },
    [](atom::pointer_moved, const std::string&, const pointer_record&) {},
    [](atom::offer, const version_ref& v, bool, const std::string&) -> caf::result<peer_offer> {
      return to_caf_error(error{errc::not_found, "a scripted replica holds no " + to_string(v)});
    },
    [](atom::release, uint64_t) {},
    [](atom::profile, const std::string&, bool, const std::string&) -> caf::result<replica_info> {
      return to_caf_error(error{errc::invalid_argument, "a scripted replica is not profiled"});
    },
    [](atom::profile, const version_ref&, const std::string&) -> caf::result<profile_step> {
      return to_caf_error(error{errc::invalid_argument, "a scripted replica is not profiled"});
    },
    [](atom::profile, atom::done, const std::string&) -> caf::result<replica_info> {
      return to_caf_error(error{errc::invalid_argument, "a scripted replica is not profiled"});
    },
    [](atom::profile, uint64_t, const profile_step&) {},
    [](atom::profile, atom::tick, uint64_t) {},
    [](atom::tick) {},
    [](atom::drain_check) {},
    [](atom::lane_work) {},
    [](atom::staged, const work_report&) {},
    [](atom::committed, const work_report&) {},
    [](atom::rebuilt, const work_report&) {},
    [](atom::generated, uint64_t, const replica_answer&, const caf::error&,
       const caf::optional<uint64_t>&) {},
  };
}

} // namespace stitch::testing
