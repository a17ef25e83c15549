#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <map>
#include <memory>

#include "actors/rollout_driver_actor.hpp"
#include "actors/workers.hpp"

namespace stitch {

struct rollout_driver_state {
  static inline const char* name = "rollout_driver";

  std::shared_ptr<executor> workers;
  std::map<uint64_t, caf::typed_response_promise<std::vector<engine::rollout_result>>> pending;
  uint64_t next_id = 1;
  uint64_t batches_served = 0;
  uint64_t rollouts_served = 0;
};

/// Samples on `workers` (each batch runs its rollouts on threads of its own);
/// the actor never blocks.
rollout_driver_actor::behavior_type
rollout_driver(rollout_driver_actor::stateful_pointer<rollout_driver_state> self,
               std::shared_ptr<executor> workers);

} // namespace stitch
