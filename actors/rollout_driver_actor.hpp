#pragma once

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/value_types.hpp"
#include "runtime/engine/rollout_client.hpp"

namespace stitch {

/// What a trainer asks a rollout driver for: `count` rollouts of the toy
/// task through the gateway at `host:port` with `min_version`.
struct rollout_request {
  std::string gateway_host;
  uint16_t gateway_port = 0;
  std::string pool = "default";
  uint64_t min_version = 0;
  uint32_t count = 0;
  uint64_t seed_base = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_request& x) {
  return f(caf::meta::type_name("stitch.rollout_request"), x.gateway_host, x.gateway_port, x.pool,
           x.min_version, x.count, x.seed_base);
}

namespace engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_sample& x) {
  return f(caf::meta::type_name("stitch.rollout_sample"), x.prompt, x.tokens, x.behaviour_logprobs,
           x.reward, x.version, x.token_versions);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_result& x) {
  return f(caf::meta::type_name("stitch.rollout_result"), x.ok, x.sample, x.violation, x.error);
}

} // namespace engine

} // namespace stitch

CAF_BEGIN_TYPE_ID_BLOCK(stitch_rollout, ::stitch::type_ids::rollout)
CAF_ADD_TYPE_ID(stitch_rollout, (stitch::rollout_request))
CAF_ADD_TYPE_ID(stitch_rollout, (stitch::engine::rollout_sample))
CAF_ADD_TYPE_ID(stitch_rollout, (stitch::engine::rollout_result))
CAF_ADD_TYPE_ID(stitch_rollout, (std::vector<stitch::engine::rollout_result>) )
CAF_ADD_ATOM(stitch_rollout, stitch::atom, rollouts, "rollouts")
CAF_END_TYPE_ID_BLOCK(stitch_rollout)

static_assert(caf::id_block::stitch_rollout::end <= stitch::type_ids::end);

namespace stitch {

/// ROLLOUT DRIVER (built-in): the demo's rollout client as a service on its
/// own node (DESIGN §2). A trainer asks for a batch of constrained rollouts;
/// the driver samples them through the gateway and sends them back, checked
/// against their constraint.
using rollout_driver_actor = caf::typed_actor<
  caf::replies_to<atom::rollouts, rollout_request>::with<std::vector<engine::rollout_result>>,
  // Internal: a worker finished batch `id`.
  caf::reacts_to<atom::done, uint64_t, std::vector<engine::rollout_result>>>;

} // namespace stitch
