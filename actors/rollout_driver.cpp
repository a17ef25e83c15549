#include "actors/rollout_driver.hpp"

#include <caf/all.hpp>

#include "actors/credentials.hpp"
#include "actors/log.hpp"

namespace stitch {

/// Bounds what one request may ask for.
constexpr uint32_t max_rollouts_per_batch = 1024;

rollout_driver_actor::behavior_type
rollout_driver(rollout_driver_actor::stateful_pointer<rollout_driver_state> self,
               std::shared_ptr<executor> workers) {
  self->state.workers = std::move(workers);
  return {
    [self](atom::rollouts,
           const rollout_request& req) -> caf::result<std::vector<engine::rollout_result>> {
      if (req.count == 0 || req.count > max_rollouts_per_batch)
        return to_caf_error({errc::invalid_argument, "count: must be in [1, "
                                                       + std::to_string(max_rollouts_per_batch)
                                                       + "], not " + std::to_string(req.count)});
      if (req.gateway_host.empty() || req.gateway_port == 0)
        return to_caf_error({errc::invalid_argument, "the request names no gateway"});
      auto& st = self->state;
      auto id = st.next_id++;
      auto promise = self->make_response_promise<std::vector<engine::rollout_result>>();
      st.pending.emplace(id, promise);
      st.workers->post([self = caf::actor_cast<rollout_driver_actor>(self), id, req] {
        auto results = engine::rollout_batch({req.gateway_host, req.gateway_port, req.pool},
                                             req.min_version, req.count, req.seed_base);
        send_to_itself(self, atom::done_v, id, std::move(results));
      });
      return promise;
    },
    [self](atom::done, uint64_t id, std::vector<engine::rollout_result>& results) {
      auto& st = self->state;
      if (!from_itself(self))
        return;
      auto it = st.pending.find(id);
      if (it == st.pending.end())
        return;
      ++st.batches_served;
      st.rollouts_served += results.size();
      if (st.batches_served % 10 == 1)
        log::info("rollout_driver", std::to_string(st.batches_served) + " rollout batches served ("
                                      + std::to_string(st.rollouts_served) + " rollouts)");
      it->second.deliver(std::move(results));
      st.pending.erase(it);
    },
  };
}

} // namespace stitch
